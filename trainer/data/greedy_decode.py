"""The one batched decoder: prompts of every length decoded together as `generate` batches them (left-padded, the
padding masked, positions counted from each row's first token). The walk decodes its reference continuations with it;
on a GPU the recipe's answers (greedy) and synthesized prompts (sampled) come from it too, in batches of a thousand
rows or more, sorted by length so little is padding, each batch ended once every row has written a stop token.

The target families the trainer supports decode over a preallocated cache, CUDA graphs on a GPU
(static_decode.py); any other model through transformers' forward with a cache that grows in place
(decode_cache.py). A row may round apart from a lone decode's in the last bits: the walk's lossless check calls that
a near-tie."""

from __future__ import annotations

import torch

from trainer.data.static_decode import Sampling, StaticDecoder, choose, supports

# How often (in decoding steps) a batch asks the device whether every row has stopped: each ask waits for the GPU.
STOP_CHECK_EVERY = 16


def padded_greedy(target, prompts: list[list[int]], new_tokens: int, batch: int = 64, *,
                  stop_ids: tuple[int, ...] = (), by_length: bool = False, progress=None) -> list[list[int]]:
    """Each prompt's greedy continuation of at most `new_tokens` tokens (padded_decode's arguments)."""
    return padded_decode(target, prompts, new_tokens, batch, stop_ids=stop_ids, by_length=by_length,
                         progress=progress)


@torch.no_grad()
def padded_decode(target, prompts: list[list[int]], new_tokens: int, batch: int = 64, *,
                  stop_ids: tuple[int, ...] = (), by_length: bool = False, progress=None,
                  sampling: Sampling | None = None) -> list[list[int]]:
    """Each prompt's continuation of at most `new_tokens` tokens, greedy or drawn under `sampling`; with `stop_ids`,
    cut before the first of them (the batch stops once every row has written one). `by_length` decodes prompts of
    like lengths together (the order of the result is the prompts' either way); `progress(done, total, tokens)`
    follows each batch."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i])) if by_length else list(range(len(prompts)))
    decode = _decode_static if supports(target) else _decode_growing
    continuations: list[list[int]] = [[] for _ in prompts]
    written = 0
    for start in range(0, len(order), batch):
        chosen = order[start:start + batch]
        rows = decode(target, [prompts[i] for i in chosen], new_tokens, stop_ids, sampling)
        for index, tokens in zip(chosen, _cut(rows, stop_ids)):
            continuations[index] = tokens
            written += len(tokens)
        if progress is not None:
            progress(min(start + batch, len(order)), len(order), written)
    return continuations


def _padded(chunk: list[list[int]], device):
    width = max(map(len, chunk))
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in chunk], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
    return ids, mask


class _Stops:
    """Whether every row has written a stop token, asked of the device only every STOP_CHECK_EVERY steps."""

    def __init__(self, stop_ids: tuple[int, ...], rows: int, device):
        self.stops = torch.tensor(stop_ids, device=device) if stop_ids else None
        self.stopped = torch.zeros(rows, dtype=torch.bool, device=device)

    def all_stopped(self, step: int, tokens) -> bool:
        if self.stops is None:
            return False
        self.stopped |= torch.isin(tokens[:, 0], self.stops)
        return step % STOP_CHECK_EVERY == STOP_CHECK_EVERY - 1 and bool(self.stopped.all())


def _decode_static(target, chunk, new_tokens: int, stop_ids, sampling) -> list[list[int]]:
    device = next(target.parameters()).device
    ids, mask = _padded(chunk, device)
    width = ids.shape[1]
    decoder = StaticDecoder(target, len(chunk), width + new_tokens, sampling)
    out = torch.zeros(len(chunk), new_tokens, dtype=torch.long, device=device)
    stops = _Stops(stop_ids, len(chunk), device)
    token, written = decoder.prefill(ids, mask), 1
    out[:, :1] = token
    while written < new_tokens and not stops.all_stopped(written - 1, token):
        token = decoder.step(width + written - 1)
        out[:, written:written + 1] = token
        written += 1
    return out[:, :written].tolist()


def _decode_growing(target, chunk, new_tokens: int, stop_ids, sampling) -> list[list[int]]:
    from trainer.data.decode_cache import forward_cached, growing_cache  # transformers: imported where a target decodes

    device = next(target.parameters()).device
    ids, mask = _padded(chunk, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    stops = _Stops(stop_ids, len(chunk), device)
    cache, chosen = growing_cache(), []
    for step in range(new_tokens):
        # Only the last position's logits: a prefill's over every position is rows x width x vocab (51 GiB for
        # 2,048 SmolLM2 rows), for one token a row.
        logits = forward_cached(target, ids, cache, attention_mask=mask, position_ids=positions,
                                logits_to_keep=1).logits[:, -1]
        ids = choose(logits, sampling)  # (rows, 1)
        chosen.append(ids)
        if stops.all_stopped(step, ids):
            break
        mask = torch.cat([mask, mask.new_ones(len(chunk), 1)], dim=1)
        positions = positions[:, -1:] + 1
    return torch.cat(chosen, dim=1).tolist()


def _cut(rows: list[list[int]], stop_ids: tuple[int, ...]) -> list[list[int]]:
    if not stop_ids:
        return rows
    return [row[:next((i for i, token in enumerate(row) if token in stop_ids), len(row))] for row in rows]
