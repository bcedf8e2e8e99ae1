"""python -m trainer: the bundled DFlash drafter trainer (train, prepare, eval, export, warmup, describe, selftest,
make-target, load-cache, convert-gguf; `python -m trainer COMMAND --help` explains each). The commands live in
trainer/cli/, one module each; this dispatcher parses, applies what every command shares, and maps errors."""

from __future__ import annotations

import argparse
import sys

from trainer.cli import COMMANDS
from trainer.common.errors import TrainerInputError
from trainer.common.notices import filter_known_notices
from trainer.train.launcher import pin_local_gpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # torchrun hands it on to each rank
    filter_known_notices()  # before transformers or the trainer import torchao
    if getattr(args, "gpus", None):
        if args.nproc_per_node and args.nproc_per_node != args.gpus:
            parser.error("--gpus is --nproc-per-node on GPUs: give one of them")
        args.nproc_per_node = args.gpus
    if args.command == "train" and not (args.targets or args.drafters):
        pin_local_gpu()  # before anything imports torch
    try:
        return next(command for command in COMMANDS if command.NAME == args.command).run(args)
    except TrainerInputError as exc:  # anything else is a bug or torch's failure: its traceback is kept
        print(f"Error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
