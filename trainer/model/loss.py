"""Anchors, blocks and the weighted block loss (a chunked LM-head cross-entropy)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def sample_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, num_anchors: int, block_size: int,
                   generator: torch.Generator, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Up to num_anchors positions per row, without replacement, sorted; -1 pads.

    An anchor a qualifies when its whole continuation a+1..a+bs-1 lies inside its document and its
    first predicted token is supervised; drawn uniformly among those, each document of a packed row
    gets anchors in proportion to its supervised tokens. loss_mask (B, S) bool, lengths (B,),
    doc_ids (B, S) (-1 = padding) -> anchors (B, N) long.
    """
    batch, seq_len = loss_mask.shape
    anchors = torch.full((batch, num_anchors), -1, dtype=torch.long)
    positions = torch.arange(seq_len)
    last = (positions + block_size - 1).clamp(max=seq_len - 1)
    for row in range(batch):
        fits = positions + block_size - 1 < lengths[row]
        if doc_ids is not None:
            docs = doc_ids[row].cpu()
            fits = fits & (docs[last] == docs) & (docs >= 0)
        supervised = torch.zeros(seq_len, dtype=torch.bool)
        supervised[:-1] = loss_mask[row, 1:].cpu()
        candidates = positions[fits & supervised]
        if len(candidates) == 0:
            continue
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:num_anchors]]
        anchors[row, : len(chosen)] = chosen.sort().values
    return anchors


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Weight of slot k: 0 for the anchor slot, exp(-(k-1)/gamma) for k = 1..bs-1. -> (bs,)"""
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.where(k == 0, torch.zeros(()), torch.exp(-(k - 1) / gamma))


def block_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor,
                  block_size: int, gamma: float, mask_token_id: int):
    """Block inputs [anchor, MASK x (bs-1)], labels (token anchor+k) and per-slot weights, each (B, N*bs)."""
    batch, num_blocks = anchors.shape
    slot = torch.arange(block_size, device=anchors.device)
    pos = anchors.clamp(min=0)[:, :, None] + slot  # (B, N, bs)
    valid = (anchors[:, :, None] >= 0) & (pos < lengths.to(anchors.device)[:, None, None])
    pos = pos.clamp(max=input_ids.shape[1] - 1)
    labels = torch.gather(input_ids, 1, pos.view(batch, -1)).view(batch, num_blocks, block_size)
    supervised = torch.gather(loss_mask, 1, pos.view(batch, -1)).view(batch, num_blocks, block_size)
    weights = slot_weights(block_size, gamma).to(anchors.device) * (valid & supervised)
    block_ids = torch.full_like(labels, mask_token_id)
    block_ids[:, :, 0] = labels[:, :, 0]  # slot 0 is the anchor token itself
    return block_ids.view(batch, -1), labels.view(batch, -1), weights.view(batch, -1).float()


def _chunk_loss(hidden, head_weight, labels, weights):
    logits = (hidden @ head_weight.t()).float()  # (chunk, V)
    return (F.cross_entropy(logits, labels, reduction="none") * weights).sum()


def weighted_block_loss(hidden: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor,
                        weights: torch.Tensor, chunk: int) -> torch.Tensor:
    """sum(w * CE) / sum(w) over positions with weight > 0, without materialising (positions x vocab).

    Each chunk's logits are recomputed in backward (checkpoint), so peak memory holds one chunk.
    """
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels, flat_weights = labels.reshape(-1), weights.reshape(-1)
    total = flat_hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, flat_hidden.shape[0], chunk):
        part = slice(start, start + chunk)
        total = total + checkpoint(_chunk_loss, flat_hidden[part], head_weight, flat_labels[part],
                                   flat_weights[part], use_reentrant=False)
    return total / flat_weights.sum().clamp(min=1e-6)

