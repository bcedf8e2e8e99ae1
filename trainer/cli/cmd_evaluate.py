"""`python -m trainer evaluate`: a checkpoint or an export walked on prompt files, as `envkit eval` reports it:
per file the walk's figures beside the two rules, each prompt's acceptance, the acceptance at each draft position,
the worst prompts; the cost of a drafter and a target step on this device and the speedup estimate; with --out,
eval.json, per_prompt.csv and report.html."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from trainer.common.errors import TrainerInputError

NAME = "evaluate"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="a checkpoint or an export walked on prompt files, with a report (envkit eval)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt", help="RUN_DIR/checkpoint.pt")
    source.add_argument("--export", metavar="DIR", help="a directory `envkit export` wrote, evaluated as served")
    p.add_argument("--prompts", metavar="FILE", action="append", required=True,
                   help="JSONL: prompt or text strings, or conversations (rendered with the run's chat template "
                        "kwargs); repeat for several kinds of traffic")
    p.add_argument("--target", metavar="DIR", help="the target model dir (default: the one the drafter trained with)")
    p.add_argument("--new-tokens", type=int, metavar="N", help="tokens generated a prompt (default: the run's)")
    p.add_argument("--max-prompts", type=int, default=0, metavar="N", help="the first N prompts a file (0: all)")
    p.add_argument("--reference-prompts", type=int, default=4, metavar="N",
                   help="an export: the first N prompts of the first file decoded by the reference dflash, where the "
                        "venv has it")
    p.add_argument("--device")
    p.add_argument("--out", metavar="DIR", help="write eval.json, per_prompt.csv and report.html there (a new dir)")


def run(args) -> int:
    from trainer.eval import report_files

    if args.out:
        report_files.check_out(Path(args.out).absolute())  # before any model is read
        report_files.require_plotting()
    if args.new_tokens is not None and args.new_tokens < 2:
        raise TrainerInputError("--new-tokens must be at least 2 (a walk needs a token to draft after)")
    names = [Path(path).name for path in args.prompts]
    if len(set(names)) < len(names):
        raise TrainerInputError("--prompts: two files share a name; give each kind of traffic its own file name")
    result, per_prompt = evaluate(args, log=lambda message: print(message, file=sys.stderr, flush=True))
    if args.out:
        report_files.write(Path(args.out), result, per_prompt)
    print(json.dumps(result))
    return 0


def evaluate(args, log) -> tuple[dict, list[dict]]:
    from trainer.eval import loaded as loading, prompt_report, step_cost

    if args.ckpt:
        loaded = loading.from_checkpoint(Path(args.ckpt), args.target, args.device)
    else:
        loaded = loading.from_export(Path(args.export), args.target, args.device)
    cfg = loaded.cfg
    new_tokens = args.new_tokens or cfg.walk_new_tokens
    tokenizer = _tokenizer(loaded.tokenizer_dir)
    by_file = {Path(path).name: _prompts(path, tokenizer, cfg, new_tokens, args.max_prompts) for path in args.prompts}
    files, per_prompt = {}, []
    for name, prompts in by_file.items():
        report = prompt_report.evaluate_file(loaded, name, prompts, new_tokens, tokenizer, log)
        files[name] = report["figures"]
        per_prompt += report["per_prompt"]
    every = [prompt for prompts in by_file.values() for prompt in prompts]
    typical = sorted(every, key=len)[len(every) // 2]
    log(f"eval: timing a drafter step and a target step after a {len(typical)}-token prompt")
    cost = step_cost.measure(loaded, typical)
    reference = None
    if args.export:
        from trainer.eval import reference_decode

        log("eval: decoding the first prompts with the reference dflash, where this venv has it")
        reference = reference_decode.measure(Path(args.export), loaded, next(iter(by_file.values())), new_tokens,
                                             args.reference_prompts)
    result = {"source": str(Path(args.ckpt or args.export).absolute()), "kind": loaded.source,
              "step": loaded.step, "block_size": cfg.drafter.block_size, "new_tokens": new_tokens,
              "files": files, "cost": cost,
              "speedup": {name: step_cost.speedups(cost, f["walk_tau"], f["walk_copy_tau"]) for name, f in files.items()},
              "tau_median_over_files": round(statistics.median(f["walk_tau"] for f in files.values()), 4),
              "reference_dflash": reference}
    return result, per_prompt


def _prompts(path: str, tokenizer, cfg, new_tokens: int, limit: int) -> list[list[int]]:
    from trainer.data.rows import read_walk_prompts

    if tokenizer is None:
        raise TrainerInputError("--prompts needs a tokenizer, and this drafter's target has none (a random target): "
                                "evaluate a run trained on a real or recipe target")
    return read_walk_prompts(path, tokenizer, cfg.data.chat_template_kwargs, limit, new_tokens,
                             cfg.target.max_position_embeddings)


def _tokenizer(directory: str | None):
    if not directory:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)

