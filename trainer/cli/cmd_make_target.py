"""`python -m trainer make-target`: a small Qwen3 target and tokenizer trained on this interpreter's stdlib."""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAME = "make-target"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="train a small Qwen3 target and tokenizer on this interpreter's stdlib "
                                  "sources (the `code` preset's target)")
    p.add_argument("--recipe", default="code_tiny", help="code_tiny (CPU, ~1 min) | code_small (one GPU)")
    p.add_argument("--out", help="directory to create (default: built once into $ENVKIT_HOME/targets and reused)")
    p.add_argument("--seed", type=int, default=0, help="the weights' and batches' seed (0: the recipe as shipped)")


def run(args) -> int:
    """Train a small Qwen3 target and its tokenizer on the stdlib sources (trainer/targets/maketarget.py)."""
    from trainer.targets import maketarget

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731  (stdout is the JSON result)
    if args.out:
        record = maketarget.build(args.recipe, Path(args.out), seed=args.seed, log=log)
        out = Path(args.out).absolute()
    else:
        out = maketarget.ensure(args.recipe, args.seed, log=log)
        record = maketarget.check_built(out)
    summary = {k: record[k] for k in ("recipe", "key", "parameters", "train_loss", "held_out_loss", "seconds")}
    print(json.dumps({"out": str(out), **summary, "held_out_files": record["corpus"]["held_out_files"],
                      "train_files": record["corpus"]["train_files"]}))
    return 0
