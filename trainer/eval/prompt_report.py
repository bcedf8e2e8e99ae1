"""One prompt file evaluated as `envkit eval` reports it: the walk over every prompt (trainer/eval/walk.py), with
each prompt's figures, the acceptance at each draft position, and the worst prompts walked again with the target
verifying each block, so what was drafted and what the target wrote can be read side by side."""

from __future__ import annotations

import statistics
import time

import torch

from trainer.eval import walk

WORST_SHOWN = 3
PREVIEW_CHARS = 100


def evaluate_file(loaded, name: str, prompts: list[list[int]], new_tokens: int, tokenizer, log) -> dict:
    """The walk's figures for one file, the per-prompt table and the worst prompts, reporting progress to `log`."""
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        elapsed = time.perf_counter() - started
        eta = elapsed / done * (total - done)
        log(f"eval {name}: {done}/{total} prompts walked ({elapsed:.0f}s, about {eta:.0f}s left)")

    block = loaded.cfg.drafter.block_size
    with torch.no_grad():
        result = walk.evaluate_walk(loaded.target, loaded.proposer(), prompts, new_tokens, block, loaded.layer_ids,
                                    loaded.dtype, progress=progress)
    left_out = set(result["walk_degenerate_prompts"])
    counted = [i for i in range(len(prompts)) if i not in left_out] or list(range(len(prompts)))
    taus = result["walk_tau_by_prompt"]
    per_prompt = [{"file": name, "index": i + 1, "prompt_tokens": len(prompt), "tau": taus[i],
                   "copy_tau": result["walk_copy_tau_by_prompt"][i], "repeat_tau": result["walk_repeat_tau_by_prompt"][i],
                   "degenerate": i in left_out, "prompt_end": _preview(tokenizer, prompt)}
                  for i, prompt in enumerate(prompts)]
    figures = {key: result[key] for key in ("walk_tau", "walk_copy_tau", "walk_repeat_tau", "walk_prompts",
                                            "walk_counted", "walk_degenerate", "walk_near_ties", "walk_verified",
                                            "walk_verified_agree", "walk_positions", "walk_new_tokens")}
    figures["walk_median_tau"] = round(statistics.median(taus[i] for i in counted), 4)
    figures["worst"] = worst_prompts(loaded, prompts, counted, taus, new_tokens, tokenizer)
    figures["seconds"] = round(time.perf_counter() - started, 2)
    return {"figures": figures, "per_prompt": per_prompt}


def worst_prompts(loaded, prompts, counted: list[int], taus: list[float], new_tokens: int, tokenizer) -> list[dict]:
    """The counted prompts of lowest acceptance, each walked with the target verifying every block: per forward,
    the drafted block, how much of it was accepted and the target's own token."""
    shown = []
    for index in sorted(counted, key=lambda i: (taus[i], i))[:WORST_SHOWN]:
        trace: list[walk.Forward] = []
        with torch.no_grad():
            walk.walk(loaded.target, loaded.proposer(), prompts[index], new_tokens, loaded.cfg.drafter.block_size,
                      loaded.layer_ids, trace)
        entry = {"index": index + 1, "tau": taus[index], "forwards": len(trace),
                 "steps": [{"drafted": step.draft, "accepted": step.accepted, "target": step.target_token}
                           for step in trace[:12]]}
        if tokenizer is not None:
            entry["walk"] = walk.render_example(tokenizer, prompts[index], trace)
        shown.append(entry)
    return shown


def _preview(tokenizer, prompt: list[int]) -> str:
    """The end of the prompt as text (what the drafter continues from), shown as a Python literal."""
    if tokenizer is None:
        return f"<{len(prompt)} tokens>"
    return repr(tokenizer.decode(prompt[-48:]))[-PREVIEW_CHARS:]
