"""The decoding walk's cost: the target's greedy continuation plus a verified walk (copy proposer), per prompt.

    PYTHONPATH=. python bench/walk_speed.py [--prompts 8] [--new-tokens 64] [--prompt-len 64] [--repeats 3]

Runs on the tiny preset's random target, on CUDA when there is one. Prints one JSON line: median seconds per
prompt for the greedy continuation and for the walk, and the walk's tau (which must not change with the method).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trainer.config.schema import tiny
from trainer.eval import walk
from trainer.model.target import build_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tiny()
    target = build_target(cfg.target, device=device).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.target.vocab_size - 1, (args.prompt_len,), generator=generator).tolist()
               for _ in range(args.prompts)]
    greedy_s, walk_s, taus = [], [], []
    with torch.no_grad():
        for _ in range(args.repeats):
            started = time.perf_counter()
            for prompt in prompts:
                walk.greedy_continuation(target, prompt, args.new_tokens)
            greedy_s.append((time.perf_counter() - started) / len(prompts))
            started = time.perf_counter()
            per_forward = [walk.walk(target, walk.copy_proposer(16), p, args.new_tokens, 16, [1, 2])[1]
                           for p in prompts]
            walk_s.append((time.perf_counter() - started) / len(prompts))
            taus.append(statistics.mean(sum(f) / len(f) for f in per_forward))
    print(json.dumps({"device": device, "prompts": args.prompts, "new_tokens": args.new_tokens,
                      "prompt_len": args.prompt_len, "greedy_s_per_prompt": round(statistics.median(greedy_s), 4),
                      "walk_s_per_prompt": round(statistics.median(walk_s), 4), "copy_tau": round(taus[-1], 4)}))


if __name__ == "__main__":
    main()
