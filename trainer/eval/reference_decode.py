"""An export decoded by Z Lab's reference `dflash` (dflash/model.py's `dflash_generate`), where the evaluating venv
has it: its acceptance and decode speed on the first prompts, beside the target's own greedy decoding of the same
prompts, each continuation checked equal to the target's. A measurement of the loader serving engines follow,
next to envkit's estimate; nothing is installed for it (the training locks do not hold `dflash`)."""

from __future__ import annotations

import time
from importlib import metadata
from pathlib import Path

import torch

def measure(export: Path, loaded, prompts: list[list[int]], new_tokens: int, limit: int = 4) -> dict:
    try:
        from dflash import model as reference
    except ImportError:
        return {"installed": False}
    device = next(loaded.target.parameters()).device
    if device.type != "cuda":
        reference._cuda_time = time.perf_counter  # it synchronises CUDA to time; on a CPU there is nothing to wait for
    draft = reference.DFlashDraftModel.from_pretrained(str(export), dtype=loaded.dtype).to(device).eval()
    acceptance, equal, decoding, plain, tokens = [], 0, 0.0, 0.0, 0
    for prompt in prompts[:limit]:
        ids = torch.tensor([prompt], device=device)
        started = time.perf_counter()
        stats = reference.dflash_generate(draft, loaded.target, ids, max_new_tokens=new_tokens, stop_token_ids=None,
                                          return_stats=True)
        decoding += _since(started, device)
        started = time.perf_counter()
        with torch.no_grad():
            greedy = loaded.target.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                            do_sample=False)
        plain += _since(started, device)
        produced = stats.output_ids[0, len(prompt):].tolist()
        equal += produced == greedy[0, len(prompt):len(prompt) + len(produced)].tolist()
        acceptance.append(sum(stats.acceptance_lengths) / len(stats.acceptance_lengths))
        tokens += len(produced)
    count = len(acceptance)
    return {"installed": metadata.version("dflash"), "prompts": count, "tau": round(sum(acceptance) / count, 4),
            "equal_to_target_greedy": equal, "tokens_per_s": round(tokens / decoding, 1),
            "target_tokens_per_s": round(tokens / plain, 1), "speedup": round(plain / decoding, 3)}


def _since(started: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
