"""`python -m trainer warmup`: every length bucket compiled single-threaded into the compile cache (what
`envkit warm-cache` runs), then the cache counters printed."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from trainer.cli.options import add_run_options, config_from, refuse_train_only_flags
from trainer.common.errors import TrainerInputError

NAME = "warmup"
HELP = "compile every length bucket single-threaded into the compile cache (envkit warm-cache)"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, allow_abbrev=False, help=HELP, description=HELP)
    add_run_options(p, NAME)
    p.add_argument("--export", help="after warming, write torch's Mega-Cache blob to this file")


def run(args) -> int:
    """Compile every bucket single-threaded (what `envkit warm-cache` runs), then print the counters."""
    from trainer.train.loop import Trainer
    from trainer.metrics.monitor import inductor_cache_counters

    cfg = config_from(args)
    refuse_train_only_flags(args, "warmup")
    if not cfg.compile:
        raise TrainerInputError("this config has compile off: there is nothing to warm (turn compile on, or run "
                                "without a warm cache)")
    # The resolved config stays as it is (the env key was computed from it); only the data the warm-up needs
    # is smaller, which decides no compiled shape.
    small = copy.deepcopy(cfg)
    small.data.num_sequences = min(cfg.data.num_sequences, 4 * cfg.batch_size)
    small.data.eval_sequences = 1
    started = time.perf_counter()
    # What the warm-up says (a target built on first use takes minutes) reaches envkit as JSON lines it shows.
    log = lambda m: print(json.dumps({"note": m}), flush=True)  # noqa: E731
    if args.targets or args.drafters:  # a threaded layout compiles for every device it uses (the index is in the key)
        trainer = Trainer.threaded(small, Path(args.out), targets=(args.targets or args.drafters).split(","),
                                   drafters=(args.drafters or args.targets).split(","), log=log)
    else:
        trainer = Trainer.sequential(small, Path(args.out), device=args.device, log=log)

    def progress(done, total, bucket):
        print(json.dumps({"progress": done, "total": total, "bucket": bucket,
                          "seconds": round(time.perf_counter() - started, 2)}), flush=True)

    buckets = trainer.warmup(progress)
    if args.export:
        import torch

        blob = torch.compiler.save_cache_artifacts()
        if blob is None:
            raise RuntimeError("torch recorded no cache artifacts to export")
        Path(args.export).write_bytes(blob[0])
    print(json.dumps({"buckets": buckets, "counters": inductor_cache_counters(),
                      "seconds": round(time.perf_counter() - started, 2)}), flush=True)
    return 0
