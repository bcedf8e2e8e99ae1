"""`python -m trainer prepare`: a data file tokenized once into a memory-mapped token store that runs reuse."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from trainer.cli.options import add_run_options, config_from
from trainer.common.errors import TrainerInputError
from trainer.common.files import read_json_record

NAME = "prepare"
HELP = "tokenize a data file once into a memory-mapped token store that runs reuse (JSON with --json)"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, allow_abbrev=False, help=HELP, description=HELP)
    add_run_options(p, NAME)
    p.add_argument("--json", action="store_true", help="print the store, its counts, seconds, reused")
    p.add_argument("--verify", action="store_true", help="re-hash every file of the store against its manifest")


def run(args) -> int:
    """The data file's token store, prepared now or found intact (trainer/data/store.py)."""
    from trainer.data import store, store_reader
    from trainer.targets.locate import target_dir, tokenizer_source

    cfg = config_from(args)
    if not cfg.data.path:
        raise TrainerInputError("prepare needs --data PATH (JSONL or a plain text file)")
    if cfg.target.path or cfg.target.recipe:  # the vocabulary the run's target has (what train checks ids against)
        config = read_json_record(Path(target_dir(cfg.target, log=lambda m: print(m, file=sys.stderr))) / "config.json")
        if not config or not isinstance(config.get("vocab_size"), int):
            raise TrainerInputError(f"the target {cfg.target.path or cfg.target.recipe} has no config.json with a "
                                    f"vocab_size")
        cfg.target.vocab_size = config["vocab_size"]
        vocabulary = f"the vocabulary of the target {cfg.target.path or cfg.target.recipe}"
    elif args.tokenizer and not (args.preset or args.config):  # the tokenizer's own ids, not a preset's guess
        from transformers import AutoTokenizer

        cfg.target.vocab_size = len(AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True))
        vocabulary = f"the vocabulary of the tokenizer {args.tokenizer}"
    else:
        default = "" if (args.preset or args.config) else ", the default"
        vocabulary = f"the {cfg.preset} preset's {cfg.target.vocab_size}-token vocabulary{default}"
    prepared = store.prepare(cfg.data.path, tokenizer_dir=tokenizer_source(cfg),
                             template_kwargs=cfg.data.chat_template_kwargs, skip_bad=cfg.data.skip_bad,
                             vocab_size=cfg.target.vocab_size, progress=store.Progress(), vocabulary=vocabulary)
    if args.verify:
        store_reader.open_store(Path(prepared.store), verify=True)
        store_reader.verify_source(Path(prepared.store), Path(cfg.data.path))
    result = dataclasses.asdict(prepared) | {"verified": bool(args.verify)}
    if args.json:
        print(json.dumps(result))
    else:
        how = "reused" if prepared.reused else f"prepared in {prepared.seconds:.1f}s ({prepared.rows_per_s:,.0f} rows/s)"
        print(f"{prepared.store}: {prepared.rows:,} rows, {prepared.tokens:,} tokens, {prepared.skipped} malformed "
              f"lines skipped, {prepared.untrainable} with nothing supervised; {how}"
              + ("; every file and the source re-hashed and intact" if args.verify else ""))
    return 0
