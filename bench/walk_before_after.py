"""The decoding walk's time on a trained run, the walk of an earlier commit beside this one's, the same prompts.

    python bench/walk_before_after.py --ckpt RUN/checkpoint.pt --prompts held-out.jsonl --before OLD_WALK.py

OLD_WALK.py: trainer/eval/walk.py as an earlier commit had it (`git show COMMIT:trainer/eval/walk.py > OLD_WALK.py`);
it stands in for the trainer's walk module for the "before" figures. Both walks run in this process on one loaded
checkpoint (after first, then before), each timed around `Trainer.evaluate_walk`, the device synchronised. Prints the
after figures as soon as they are measured, then one JSON line with both and the speed-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

FIGURES = ("walk_tau", "walk_repeat_tau", "walk_copy_tau", "walk_counted", "walk_degenerate", "walk_near_ties",
           "walk_verified", "walk_verified_agree")


def timed_walk(trainer, prompts) -> dict:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    row = trainer.evaluate_walk(None, False, prompts)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"seconds": round(time.perf_counter() - started, 2)} | {k: row[k] for k in FIGURES if k in row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--prompts", required=True, help="JSONL the trainer's `eval --walk --prompts` reads")
    parser.add_argument("--before", required=True, help="an earlier commit's trainer/eval/walk.py")
    args = parser.parse_args()

    from trainer.cli.cmd_eval import walk_prompts
    from trainer.config.schema import TrainConfig
    from trainer.train import checkpoint, loop

    state = checkpoint.load(Path(args.ckpt))
    cfg = TrainConfig.from_dict(state["config"])
    cfg.data.num_sequences = min(cfg.data.num_sequences, cfg.batch_size)  # as `eval` does: held-out data only
    cfg.attention, cfg.compile = "sdpa", False
    prompts = walk_prompts(args.prompts, cfg)
    trainer = loop.Trainer.sequential(cfg, Path(args.ckpt).parent, log=lambda m: print(m, file=sys.stderr))
    trainer.load_state_dict(state)

    after = timed_walk(trainer, prompts)
    print(json.dumps({"after": after}), flush=True)  # a before cut short by a time limit still leaves this
    spec = importlib.util.spec_from_file_location("walk_before", args.before)
    before_module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = before_module  # its dataclasses look their module up there
    spec.loader.exec_module(before_module)
    current, loop.walk = loop.walk, before_module
    try:
        before = timed_walk(trainer, prompts)
    finally:
        loop.walk = current
    print(json.dumps({"prompts": len(prompts), "new_tokens": cfg.walk_new_tokens, "before": before, "after": after,
                      "speedup": round(before["seconds"] / after["seconds"], 1)}))


if __name__ == "__main__":
    main()
