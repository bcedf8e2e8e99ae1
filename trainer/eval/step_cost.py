"""What a drafted block costs against a token decoded without one, measured on this device, and the speedup that
follows for a measured acceptance. An estimate, stated with its formula (docs/cli.md, `envkit eval`):

    speedup ~= tau x t_decode / (t_draft + t_verify)

t_decode: the target's cached forward of one token (plain greedy decoding makes one token a forward);
t_verify: its cached forward of a block (the anchor and block_size - 1 drafted tokens); t_draft: the drafter's
forward of one block from the target's tapped states. A cycle costs one of each and yields tau tokens. The copy rule
drafts on the host for free: tau_copy x t_decode / t_verify. Scheduling, sampling and batching are left out.
"""

from __future__ import annotations

import statistics
import time

import torch

FORMULA = "speedup ~= tau * t_decode / (t_draft + t_verify)"
REPEATS = 15
WARM_UP = 3


def _timed(device: torch.device, call) -> float:
    """The median seconds of `call` over REPEATS runs, after WARM_UP unmeasured ones."""
    times = []
    for index in range(WARM_UP + REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= WARM_UP:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.no_grad()
def measure(loaded, prompt: list[int]) -> dict:
    """Median seconds of the three forwards after `prompt` (a typical prompt of the evaluation)."""
    from trainer.eval.walk import CachedTarget

    block = loaded.cfg.drafter.block_size
    decoder = CachedTarget(loaded.target, loaded.layer_ids)
    first = decoder.feed(prompt)
    anchor = len(prompt)
    tokens = torch.tensor([list(prompt) + [int(first.logits[-1].argmax())]])
    drafted = [tokens[0, -1].item()] * block

    def decode():
        decoder.feed(drafted[:1])
        decoder.keep(anchor)

    def verify():
        decoder.feed(drafted)
        decoder.keep(anchor)

    propose = loaded.proposer()
    anchors = torch.tensor([anchor])

    def draft():
        propose.blocks(tokens, first.context, anchors)

    device = next(loaded.target.parameters()).device
    return {"t_decode_s": _timed(device, decode), "t_verify_s": _timed(device, verify),
            "t_draft_s": _timed(device, draft), "prompt_tokens": len(prompt), "block_size": block,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "formula": FORMULA}


def speedups(cost: dict, tau: float, copy_tau: float) -> dict:
    cycle = cost["t_draft_s"] + cost["t_verify_s"]
    return {"drafter": round(tau * cost["t_decode_s"] / cycle, 3),
            "copy": round(copy_tau * cost["t_decode_s"] / cost["t_verify_s"], 3)}
