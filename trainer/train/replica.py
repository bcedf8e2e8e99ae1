"""One drafter replica on one device: its weights, optimizer, schedule and (compiled) loss."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from trainer.config.schema import TrainConfig
from trainer.model.drafter import EVAL_ATTENTION
from trainer.model.loss import weighted_block_loss
from trainer.train.inputs import StepInputs


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over warmup_frac of the steps, then cosine to zero."""
    warmup = max(1, int(cfg.steps * cfg.warmup_frac))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, cfg.steps - warmup))
    return 0.5 * (1 + math.cos(math.pi * progress))


class Replica:
    def __init__(self, cfg: TrainConfig, drafter: torch.nn.Module, device: torch.device, embed_weight: torch.Tensor,
                 head_weight: torch.Tensor, attention, dtype: torch.dtype):
        self.cfg, self.device, self.attention, self.dtype = cfg, device, attention, dtype
        self.drafter = drafter.to(device)
        # The target's embedding and LM head, shared and frozen; a copy on this replica's device.
        self.embed_weight = embed_weight.to(device)
        self.head_weight = head_weight.to(device)
        fused = cfg.fused_optimizer if cfg.fused_optimizer is not None else device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                           betas=(0.9, 0.95), fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_factor(cfg, step))
        self._compiled_loss = torch.compile(self._loss, dynamic=False) if cfg.compile else self._loss

    def clone_to(self, device: torch.device) -> "Replica":
        """A replica with bit-identical weights on another device (optimizer state starts empty, as here)."""
        return Replica(self.cfg, copy.deepcopy(self.drafter), device, self.embed_weight, self.head_weight,
                       self.attention, self.dtype)

    def loss_fn(self, inputs: StepInputs):
        """The step's loss; the mask is built here, outside the compiled region (one graph per bucket)."""
        prepared = self.attention.prepare(inputs.anchors, inputs.tapped.shape[1], self.cfg.drafter.block_size,
                                          inputs.doc_ids)
        # Autocast is entered here, around the compiled region: inside it, AOTAutograd's cache refuses the graph
        # (`_enter_autocast` is not a cacheable node) and every process traces forward and backward again.
        with self._autocast():
            return self._compiled_loss(inputs.tapped, inputs.block_ids, inputs.anchors, prepared, inputs.labels,
                                       inputs.weights, inputs.positions)

    def _autocast(self):
        """Matmuls in the run's dtype; off in float32."""
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def _loss(self, tapped, block_ids, anchors, prepared, labels, weights, positions):
        # (B, Q, H) from the shared, frozen embedding; the residual stream stays float32 (matmuls autocast).
        block_embeds = F.embedding(block_ids, self.embed_weight).float()
        hidden = self.drafter(tapped.to(self.dtype), block_embeds, anchors, self.attention, prepared,
                              positions)  # (B, Q, H)
        return weighted_block_loss(hidden, self.head_weight, labels, weights, self.cfg.lm_head_chunk)

    @torch.no_grad()
    def draft(self, tapped, block_ids, anchors, positions=None, doc_ids=None) -> torch.Tensor:
        """Greedy token per block slot (B, Q), for evaluation."""
        block_embeds = F.embedding(block_ids, self.embed_weight)
        prepared = EVAL_ATTENTION.prepare(anchors, tapped.shape[1], self.cfg.drafter.block_size, doc_ids)
        with self._autocast():
            hidden = self.drafter(tapped.to(self.dtype), block_embeds, anchors, EVAL_ATTENTION, prepared, positions)
            return (hidden @ self.head_weight.t()).argmax(-1)

    def apply_gradients(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        return {"drafter": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
