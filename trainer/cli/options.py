"""The flags of the commands that resolve a run's config (train, warmup, describe, prepare): one set, so that
envkit hands a run's arguments to each, and the config resolved from them once (CLI > --config file > preset).
Flags that do not decide the config (devices, threads) only matter to train."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.common.files import read_json_file
from trainer.common.template_kwargs import parse_template_kwargs
from trainer.config import presets_help
from trainer.config.schema import TrainConfig, resolve


def add_run_options(p: argparse.ArgumentParser, command: str) -> None:
    """The run flags on a command's parser; --out is required where the command writes a run dir."""
    p.add_argument("--preset", metavar="NAME", help=presets_help())
    p.add_argument("--config", help="a JSON config: a full one (a run's config.json), or a preset's changes "
                                    "({\"preset\": \"tiny\", \"steps\": 50}); flags override it")
    p.add_argument("--out", required=command in ("train", "warmup"), help="run directory (metrics.jsonl, checkpoint.pt)")
    p.add_argument("--steps", type=int, help="steps to train (wins over --epochs)")
    p.add_argument("--epochs", type=int, help="passes over the training rows; the steps follow from it")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--num-anchors", type=int)
    p.add_argument("--data", help="JSONL (conversations, {\"text\": ...} or input_ids/loss_mask), or a plain "
                                    "text file (any other suffix; needs a tokenizer)")
    p.add_argument("--target", help="local HF model directory (default: the preset's random target)")
    p.add_argument("--tokenizer", help="tokenizer directory for conversation data")
    p.add_argument("--attention", choices=["auto", "flex", "sdpa"])
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--seed", type=int)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--skip-bad", action="store_true", help="count and skip malformed JSONL lines")
    p.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None,
                   help="several documents per row, each isolated (default: on); --no-packing: one per row")
    p.add_argument("--chat-template-kwargs", metavar="JSON",
                   help='chat template kwargs for conversation data, e.g. \'{"enable_thinking": false}\'; '
                        "recorded in the run and the export")
    p.add_argument("--walk-file", action="append", metavar="PROMPTS",
                   help="a prompt file walked at the end too, reported on its own in the summary (repeat: one kind of "
                        "traffic each, e.g. `envkit data mix`'s held-out file per source)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--fp8", choices=["off", "target", "drafter", "both"],
                   help="FP8 linears on Hopper: the frozen target's, the drafter's (torchao), or both; refused "
                        "where the device has no FP8 matmuls")
    p.add_argument("--compile-target", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the frozen target's layers for training's forwards (default: with --compile "
                        "on CUDA)")
    p.add_argument("--nproc-per-node", type=int, metavar="K",
                   help="K processes on this node, data parallel (one GPU each on CUDA, each seeing only its own "
                        "GPU), started by torchrun (torch.distributed.run)")
    p.add_argument("--nnodes", type=int, metavar="N", help="nodes in the run; each runs the same command")
    p.add_argument("--node-rank", type=int, metavar="R", help="this node's rank (torchrun's --node-rank)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="where the nodes meet (c10d rendezvous)")
    p.add_argument("--rdzv-id", metavar="ID", help="the run's rendezvous id, the same on every node")
    p.add_argument("--max-restarts", type=int, metavar="M",
                   help="restart the worker group up to M times when a worker dies; the ranks resume from "
                        "rank 0's last checkpoint")
    p.add_argument("--gpus", type=int, help="N GPUs, data parallel: one process per GPU, each a target worker "
                                             "and a drafter replica (the layout measured fastest); "
                                             "--targets/--drafters choose threads in one process instead")
    p.add_argument("--targets", help="devices of target worker threads, e.g. cuda:0,cuda:1 or cpu")
    p.add_argument("--drafters", help="devices of drafter replica threads, e.g. cuda:2,cuda:3 or cpu,cpu")
    p.add_argument("--strict-compile", action="store_true",
                   help="stop at the first recompile or eager fallback after warm-up")
    p.add_argument("--no-mitigations", action="store_true",
                   help="threads without threadsafe.install() and the compile gate (to measure them)")
    p.add_argument("--fail-at", help=argparse.SUPPRESS)  # KIND:INDEX:STEP, raises there (tests)


def config_from(args) -> TrainConfig:
    """CLI > --config file > preset, resolved once (trainer.config.schema.resolve)."""
    file_values = None
    if args.config:
        try:
            file_values = read_json_file(Path(args.config), limit=16 << 20)
        except ValueError as exc:
            raise TrainerInputError(f"--config {args.config}: cannot read a JSON config ({exc})") from None
    overrides = {"steps": args.steps, "epochs": args.epochs, "batch_size": args.batch_size, "num_anchors": args.num_anchors,
                 "attention": args.attention, "seed": args.seed, "compile": args.compile, "data.path": args.data,
                 "target.path": args.target, "data.tokenizer": args.tokenizer,
                 "data.skip_bad": True if args.skip_bad else None, "data.packing": args.packing,
                 "data.chat_template_kwargs": parse_template_kwargs(args.chat_template_kwargs), "fp8": args.fp8,
                 "compile_target": args.compile_target,
                 "walk_files": [str(Path(path).absolute()) for path in args.walk_file] if args.walk_file else None}
    return resolve(args.preset, file_values, {k: v for k, v in overrides.items() if v is not None})


TRAIN_ONLY_FLAGS = {"resume": "--resume", "gpus": "--gpus", "nproc_per_node": "--nproc-per-node",
                    "nnodes": "--nnodes", "node_rank": "--node-rank", "rdzv_endpoint": "--rdzv-endpoint",
                    "rdzv_id": "--rdzv-id", "max_restarts": "--max-restarts",
                    "strict_compile": "--strict-compile", "no_mitigations": "--no-mitigations", "fail_at": "--fail-at"}


def refuse_train_only_flags(args, command: str) -> None:
    given = [flag for name, flag in TRAIN_ONLY_FLAGS.items() if getattr(args, name, None)]
    if given:
        raise TrainerInputError(f"{', '.join(given)} only apply to `train`, not `{command}`")
