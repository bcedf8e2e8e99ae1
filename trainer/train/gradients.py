"""Gradient averaging across drafter replicas (threads) and processes (torchrun), and the check that
replicas hold the same weights."""

from __future__ import annotations

import hashlib

import torch


def mean_across(grads: list[list[torch.Tensor]], device: torch.device) -> list[torch.Tensor]:
    """Element-wise mean of each parameter's gradient over replicas, on `device`."""
    count = len(grads)
    if device.type == "cuda" and all(g[0].is_cuda for g in grads):
        from torch.cuda import comm

        return [comm.reduce_add([g[i] for g in grads], destination=device.index).div_(count)
                for i in range(len(grads[0]))]
    return [torch.stack([g[i].to(device) for g in grads]).sum(0).div_(count) for i in range(len(grads[0]))]


def all_reduce_mean(dist, grads: list[torch.Tensor], world_size: int) -> list[torch.Tensor]:
    """One all-reduce over one flat buffer per dtype (not one call per parameter), then views back."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    out: list[torch.Tensor | None] = [None] * len(grads)
    for dtype in {g.dtype for g in grads}:
        indices = [i for i, g in enumerate(grads) if g.dtype == dtype]
        flat = _flatten_dense_tensors([grads[i] for i in indices])
        dist.all_reduce(flat)
        flat.div_(world_size)
        for i, view in zip(indices, _unflatten_dense_tensors(flat, [grads[i] for i in indices])):
            out[i] = view
    return out


def any_rank(dist, flag: bool, group) -> bool:
    """True on every process when it is True on any (one tiny all-reduce): ranks must stop at the same
    step, or the one that goes on waits in its next all-reduce for a partner that has left. `group` is a
    gloo group: the flag stays on the host, so no wait for the GPUs' queued work."""
    return bool(max_across_ranks(dist, int(flag), group))


def max_across_ranks(dist, value: int, group) -> int:
    value_tensor = torch.tensor([int(value)])
    dist.all_reduce(value_tensor, op=dist.ReduceOp.MAX, group=group)
    return int(value_tensor.item())


def sum_across_ranks(dist, values: dict[str, float], group) -> dict[str, float]:
    """Each value summed over every process (one small all-reduce on the host): a group's figures are sums,
    never rank 0's times the world size. Every rank must pass the same keys."""
    names = sorted(values)
    summed = torch.tensor([float(values[name]) for name in names], dtype=torch.float64)
    dist.all_reduce(summed, group=group)
    return {name: value for name, value in zip(names, summed.tolist())}


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 over a module's parameters, bit for bit (replicas must agree exactly)."""
    digest = hashlib.sha256()
    for name, param in sorted(module.state_dict().items()):
        digest.update(name.encode() + param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
