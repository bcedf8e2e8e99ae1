"""The target's tapped states of every training row, computed once, for the sequential layout on a CPU.

The target is frozen and a row's states depend on the row alone, so a run that visits every row more
than once can compute them up front: on the tiny preset the target's forward was 25 of a step's 64 ms.
Rows are computed in a fixed order and chunking, so a resumed run reads the same values bit for bit.
A GPU run (or data whose states exceed the budget) keeps computing them per step, as serving-sized
targets need.
"""

from __future__ import annotations

import torch

from trainer.data.datasets import collate
from trainer.train.setup import Setup
from trainer.train.steps import target_states

BUDGET_BYTES = 512 << 20


class RowFeatures:
    """Row index -> (bucket length, taps x hidden) tapped states."""

    def __init__(self, states: dict[int, torch.Tensor]):
        self.states = states

    def batch(self, row_ids: torch.Tensor, length: int) -> torch.Tensor:
        """Row -1 (an empty row filling an epoch's last batch) has all-zero states: it has no tokens to attend."""
        any_state = next(iter(self.states.values()))
        empty = any_state.new_zeros(length, any_state.shape[-1])
        return torch.stack([self.states[int(i)] if int(i) >= 0 else empty for i in row_ids])


def worth_computing(setup: Setup) -> bool:
    """On a CPU target, when the states fit the budget and the run's steps read at least every row once.
    The run's steps, not those left: a resumed run must read the states the same way as before."""
    data, cfg = setup.train_data, setup.cfg
    if setup.target_device.type != "cpu" or not data.num_rows:
        return False
    width = len(setup.layer_ids) * cfg.target.hidden_size * torch.finfo(setup.dtype).bits // 8
    size = sum(bucket * len(rows) for bucket, rows in data.by_bucket.items()) * width
    return size <= BUDGET_BYTES and cfg.steps * cfg.batch_size >= data.num_rows


@torch.no_grad()
def compute(setup: Setup) -> RowFeatures:
    """Every row's states through the target, a batch of each bucket's rows at a time, as a step computes them."""
    data, cfg = setup.train_data, setup.cfg
    states = {}
    for bucket, members in sorted(data.by_bucket.items()):
        for start in range(0, len(members), cfg.batch_size):
            chunk = [int(i) for i in members[start:start + cfg.batch_size]]
            tapped = target_states(setup, setup.target, collate([data.row(i) for i in chunk], bucket))
            states.update(zip(chunk, tapped.unbind(0)))
    return RowFeatures(states)
