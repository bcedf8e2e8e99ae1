"""A training step's two halves, shared by every executor: the target side (which batch, anchors, the
target's tapped states, block targets) and the drafter side (loss, backward)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.model.loss import block_targets, sample_anchors
from trainer.model.target import compiled_target, tapped_states
from trainer.train.inputs import StepInputs
from trainer.train.replica import Replica
from trainer.train.setup import Setup, device_of


@dataclass
class Work:
    """One replica's share of a step, prepared on a target's device."""
    step: int
    inputs: StepInputs
    useful_tokens: int  # not padding
    positions: int  # padding included
    bucket: int
    stats: dict  # work_stats


def batch_slot(replica: int, replicas: int, rank: int = 0) -> int:
    """Which of a step's batches a replica trains: every (rank, replica) its own (a step has ranks x replicas)."""
    return rank * replicas + replica


def target_states(setup: Setup, target_model, batch: dict) -> torch.Tensor:
    """The target's tapped states of a batch already on the target's device (its compiled layers where
    `compile_target` gave it some: trainer/model/target.py)."""
    with compiled_target():
        return _target_states(setup, target_model, batch)


def _target_states(setup: Setup, target_model, batch: dict) -> torch.Tensor:
    if setup.cfg.data.packing:  # documents attend within themselves, positions restarting (block-diagonal causal)
        # On CUDA through flex over a document BlockMask: the blocks between documents are skipped.
        doc_ids = batch["doc_ids"] if device_of(target_model).type == "cuda" else None
        return tapped_states(target_model, batch["input_ids"], None, setup.layer_ids, batch["positions"], doc_ids)
    return tapped_states(target_model, batch["input_ids"], batch["attention_mask"], setup.layer_ids)


def step_inputs(setup: Setup, batch: dict, generator: torch.Generator, target_model=None, features=None) -> StepInputs:
    """Anchors, the target's tapped states and the block tensors of a batch, on the target's device. With
    `features` (trainer/train/features.py) the states are the rows' precomputed ones."""
    cfg = setup.cfg
    target_model = target_model or setup.target
    target_device = device_of(target_model)
    anchors = sample_anchors(batch["loss_mask"], batch["lengths"], cfg.num_anchors, cfg.drafter.block_size,
                             generator, batch["doc_ids"])
    batch = {k: v.to(target_device, non_blocking=True) for k, v in batch.items()}
    anchors = anchors.to(target_device, non_blocking=True)
    tapped = features.batch(batch["row_ids"], batch["input_ids"].shape[1]) if features is not None else \
        target_states(setup, target_model, batch)
    if cfg.drafter.context == "zeros":  # the ablation: what the drafter learns without the target's features
        tapped = torch.zeros_like(tapped)
    block_ids, labels, weights = block_targets(batch["input_ids"], batch["loss_mask"], batch["lengths"], anchors,
                                               cfg.drafter.block_size, cfg.drafter.gamma, setup.mask_token_id)
    return StepInputs(tapped, block_ids, anchors, labels, weights, batch["positions"], batch["doc_ids"])


def work_for(setup: Setup, step: int, slot: int, slots: int, target_model=None, features=None) -> Work:
    """Batch `slot` of the `slots` a step trains (the epoch order's), prepared for `step` (0-based)."""
    cfg = setup.cfg
    batch = setup.train_data.batch(step, slot, slots, cfg.batch_size, cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed * 7_919 + step * slots + slot)
    inputs = step_inputs(setup, batch, generator, target_model, features)
    return Work(step, inputs, int(batch["lengths"].sum()), int(batch["input_ids"].numel()),
                int(batch["input_ids"].shape[1]), work_stats(batch, inputs.anchors))


def forward_backward(replica: Replica, inputs: StepInputs) -> torch.Tensor:
    """The drafter's loss on prepared inputs, gradients accumulated; returns the loss (not synchronised)."""
    replica.drafter.train()
    loss = replica.loss_fn(inputs.to(replica.device))
    loss.backward()
    return loss


def work_stats(batch: dict, anchors: torch.Tensor) -> dict:
    """What a step really computed, for useful-token FLOPs: the sum of squared document lengths (the
    target's block-diagonal attention) and the anchors placed."""
    docs = batch["doc_ids"]
    counts = [torch.bincount(row[row >= 0]) for row in docs]
    return {"doc_tokens_sq": int(sum(int((c * c).sum()) for c in counts)), "anchors": int((anchors >= 0).sum()),
            "rows": int((batch["lengths"] > 0).sum())}


def compile_buckets(setup: Setup, buckets: list[int], progress=None) -> None:
    """Warm-up: every bucket through every target (their attention compiles per shape and device) and
    every replica, forward and backward, single-threaded (HAZARDS.md H4)."""
    generator = torch.Generator().manual_seed(0)
    for done, bucket in enumerate(buckets, 1):
        batch = setup.train_data.bucket_batch(bucket, setup.cfg.batch_size)
        inputs = step_inputs(setup, batch, generator, setup.targets[0])
        for target in setup.targets[1:]:  # each target's attention compiles for its own device
            step_inputs(setup, batch, generator, target)
        for replica in setup.replicas:
            forward_backward(replica, inputs)
            replica.optimizer.zero_grad(set_to_none=True)
        if progress:
            progress(done, len(buckets), bucket)
