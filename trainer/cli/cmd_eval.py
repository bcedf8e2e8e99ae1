"""`python -m trainer eval`: a checkpoint re-evaluated: teacher-forced tau, or the decoding walk (--walk)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.config.schema import TrainConfig

NAME = "eval"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="re-evaluate a checkpoint: teacher-forced tau, or the decoding walk (--walk)")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--device")
    p.add_argument("--walk", action="store_true",
                   help="acceptance length by a greedy speculative decoding walk (else teacher-forced)")
    p.add_argument("--taps", metavar="L[,L...]", help="ablation: feed the drafter these target layers' states "
                                                      "instead of those it was trained on (a tap error)")
    p.add_argument("--zero-context", action="store_true",
                   help="ablation: feed the drafter all-zero context features")
    p.add_argument("--prompts", metavar="FILE", action="append",
                   help="walk on your own prompts (JSONL: prompt or text strings, or conversations rendered with the "
                        "run's chat template kwargs) instead of the held-out rows; the first walk_prompts of them. "
                        "Repeat for several kinds of traffic: one walk a file, printed as {\"by_file\": {NAME: ...}}")


def run(args) -> int:
    from trainer.train import checkpoint
    from trainer.train.loop import Trainer

    taps = [int(t) for t in args.taps.split(",")] if args.taps else None
    if (taps is not None or args.zero_context or args.prompts) and not args.walk:
        raise TrainerInputError("--taps, --zero-context and --prompts change the decoding walk: give --walk too")
    state = checkpoint.load(Path(args.ckpt))
    cfg = TrainConfig.from_dict(state["config"])
    # Evaluation reads only the held-out data (its own seed): the training data is made as small as it may be.
    # The drafter runs through SDPA, the same mask rule as flex: uncompiled flex is refused on CUDA, and a
    # one-off evaluation would pay the compile.
    cfg.data.num_sequences = min(cfg.data.num_sequences, cfg.batch_size)
    cfg.attention, cfg.compile = "sdpa", False
    cfg.walk_files = []  # the run's own end-of-run files: not this evaluation's
    files = args.prompts or []
    by_file = {Path(path).name: walk_prompts(path, cfg) for path in files}  # a bad file fails before the model is built
    if len(by_file) < len(files):
        raise TrainerInputError("--prompts: two files share a name; give each kind of traffic its own file name")
    trainer = Trainer.sequential(cfg, Path(args.ckpt).parent, device=args.device,
                                 log=lambda m: print(m, file=sys.stderr))
    trainer.load_state_dict(state)
    if not args.walk:
        print(json.dumps(trainer.evaluate()))
    elif len(by_file) > 1:
        print(json.dumps({"by_file": {name: trainer.evaluate_walk(taps, args.zero_context, prompts)
                                      for name, prompts in by_file.items()}}))
    else:
        print(json.dumps(trainer.evaluate_walk(taps, args.zero_context, next(iter(by_file.values()), None))))
    return 0


def walk_prompts(path: str, cfg: TrainConfig) -> list[list[int]]:
    """--prompts read with the run's tokenizer (the data's, else the target's own; none for a random target)."""
    from trainer.data.rows import read_walk_prompts
    from trainer.targets.locate import target_dir
    from trainer.train.setup import load_tokenizer

    tokenizer = load_tokenizer(cfg)
    if tokenizer is None and (directory := target_dir(cfg.target)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return read_walk_prompts(path, tokenizer, cfg.data.chat_template_kwargs, cfg.walk_prompts, cfg.walk_new_tokens,
                             cfg.target.max_position_embeddings)
