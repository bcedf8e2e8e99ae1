"""What the drafter's loss reads for one batch, as the target side hands it over."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class StepInputs:
    """What the drafter's loss reads for one batch: B rows of S positions, Q = anchors x block slots."""
    tapped: torch.Tensor  # (B, S, taps x H) the target's states at the tapped layers: the drafter's context
    block_ids: torch.Tensor  # (B, Q) each block: its anchor token, then the mask token
    anchors: torch.Tensor  # (B, A) anchor positions, -1 for a padding block
    labels: torch.Tensor  # (B, Q) the token each slot must predict (-100: none)
    weights: torch.Tensor  # (B, Q) the slot's loss weight, exp(-(k-1)/gamma)
    positions: torch.Tensor  # (B, S) positions restarting per packed document
    doc_ids: torch.Tensor  # (B, S) the document of each position, -1 for padding

    def to(self, device: torch.device) -> "StepInputs":
        return StepInputs(**{f.name: getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)})
