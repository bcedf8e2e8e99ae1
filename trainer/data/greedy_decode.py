"""The one batched greedy decoder: prompts of every length decoded together as `generate` batches them (left-padded,
the padding masked, positions counted from each row's first token), the KV cache growing in place
(decode_cache.py). The walk decodes its reference continuations with it; on a GPU the recipe's answers come from it
too (batches of a thousand rows or more, sorted by length so little is padding, each batch ended once every row
has written a stop token). A row may round apart from a lone decode's in the last bits: the walk's lossless check
calls that a near-tie."""

from __future__ import annotations

import torch

# How often (in decoding steps) a batch asks the device whether every row has stopped: each ask waits for the GPU.
STOP_CHECK_EVERY = 16


@torch.no_grad()
def padded_greedy(target, prompts: list[list[int]], new_tokens: int, batch: int = 64, *,
                  stop_ids: tuple[int, ...] = (), by_length: bool = False, progress=None) -> list[list[int]]:
    """Each prompt's greedy continuation of at most `new_tokens` tokens; with `stop_ids`, cut before the first of
    them (the batch stops once every row has written one). `by_length` decodes prompts of like lengths together
    (the order of the result is the prompts' either way); `progress(done, total, tokens)` follows each batch."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i])) if by_length else list(range(len(prompts)))
    continuations: list[list[int]] = [[] for _ in prompts]
    written = 0
    for start in range(0, len(order), batch):
        chosen = order[start:start + batch]
        for index, tokens in zip(chosen, _decode_batch(target, [prompts[i] for i in chosen], new_tokens, stop_ids)):
            continuations[index] = tokens
            written += len(tokens)
        if progress is not None:
            progress(min(start + batch, len(order)), len(order), written)
    return continuations


def _decode_batch(target, chunk: list[list[int]], new_tokens: int, stop_ids: tuple[int, ...]) -> list[list[int]]:
    from trainer.data.decode_cache import forward_cached, growing_cache  # transformers: imported where a target decodes

    device = next(target.parameters()).device
    width = max(map(len, chunk))
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in chunk], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    stops = torch.tensor(stop_ids, device=device) if stop_ids else None
    stopped = torch.zeros(len(chunk), dtype=torch.bool, device=device)
    cache, chosen = growing_cache(), []
    for step in range(new_tokens):
        # Only the last position's logits: a prefill's over every position is rows x width x vocab (51 GiB for
        # 2,048 SmolLM2 rows), for one token a row.
        logits = forward_cached(target, ids, cache, attention_mask=mask, position_ids=positions,
                                logits_to_keep=1).logits[:, -1]
        ids = logits.argmax(-1, keepdim=True)  # (rows, 1)
        chosen.append(ids)
        if stops is not None:
            stopped |= torch.isin(ids[:, 0], stops)
            if step % STOP_CHECK_EVERY == STOP_CHECK_EVERY - 1 and bool(stopped.all()):
                break
        mask = torch.cat([mask, mask.new_ones(len(chunk), 1)], dim=1)
        positions = positions[:, -1:] + 1
    rows = torch.cat(chosen, dim=1).tolist()
    if not stop_ids:
        return rows
    return [row[:next((i for i, token in enumerate(row) if token in stop_ids), len(row))] for row in rows]
