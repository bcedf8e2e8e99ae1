"""python -m trainer: the bundled DFlash drafter trainer (train, prepare, eval, export, warmup, describe, selftest,
make-target, load-cache; `python -m trainer COMMAND --help` explains each).

Each command imports the torch-heavy parts it runs inside its handler: `--help`, `describe` and a refused flag
answer without importing the model, the loop or the data code."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from trainer.common import torch_build
from trainer.common.errors import TrainerInputError
from trainer.common.files import atomic_write, loads_json, read_json_file, read_json_record
from trainer.common.notices import filter_known_notices
from trainer.common.records import headline
from trainer.config.schema import PRESETS, TrainConfig, resolve
from trainer.export.place import check_out
from trainer.train.faults import Faults
from trainer.train.launcher import close_distributed, launch, pin_local_gpu, wants_launch


def _config(args) -> TrainConfig:
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
                 "data.chat_template_kwargs": _template_kwargs(args.chat_template_kwargs), "fp8": args.fp8,
                 "compile_target": args.compile_target}
    cfg = resolve(args.preset, file_values, {k: v for k, v in overrides.items() if v is not None})
    if args.steps is not None:
        cfg.epochs = None  # an explicit step count wins over epochs from any source
    return cfg


def _template_kwargs(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        kwargs = loads_json(text)
    except ValueError as exc:
        raise TrainerInputError(f"--chat-template-kwargs is not JSON ({exc}); e.g. '{{\"enable_thinking\": false}}'")
    if not isinstance(kwargs, dict):
        raise TrainerInputError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return kwargs


class Stop(Exception):
    """A second signal, or one outside the step loop: leave now, writing no checkpoint (the main thread may be
    anywhere, even inside an optimizer step, so the state in memory may not be any step's)."""


def _stop_at_step_boundary(trainer, received: list[int]):
    """The first SIGINT/SIGTERM sets the trainer's flag: it stops at the next step boundary and checkpoints
    there. A second one (or one while no step loop runs) raises Stop wherever the main thread is."""
    def handler(signum, frame):
        first = not received
        received.append(signum)
        if not (first and trainer.request_stop()):
            raise Stop

    return handler


def _make_trainer(args, cfg, log):
    """The sequential loop, or the threaded executor for --targets/--drafters and for each rank of --gpus
    or torchrun. A flag a layout cannot honour is refused, never ignored."""

    import torch

    from trainer.train.launcher import init_distributed
    from trainer.train.loop import Trainer

    if args.device and (args.targets or args.drafters):
        raise TrainerInputError("give --device or --targets/--drafters (which name every device), not both")
    dist = init_distributed()
    if not (args.targets or args.drafters or dist):
        if args.no_mitigations:
            raise TrainerInputError("--no-mitigations switches off the thread-safety mitigations, which only the "
                                    "threaded layouts use (--targets/--drafters, --gpus); this run has no threads")
        if args.fail_at:
            raise TrainerInputError("--fail-at injects a failure into a worker thread; give --targets/--drafters")
        return Trainer.sequential(cfg, Path(args.out), device=args.device, resume=args.resume, log=log,
                                  strict_compile=args.strict_compile)
    # Under torchrun each rank sees only its own GPU, as cuda:0 (launcher.pin_local_gpu).
    default = [args.device or ("cuda" if torch.cuda.is_available() else "cpu")]
    targets = args.targets.split(",") if args.targets else default
    drafters = args.drafters.split(",") if args.drafters else default
    return Trainer.threaded(cfg, Path(args.out), targets=targets, drafters=drafters,
                            mitigations=not args.no_mitigations, strict_compile=args.strict_compile,
                            faults=Faults.parse(args.fail_at), resume=args.resume, log=log, dist=dist)


def _log_line(message: str) -> None:
    """One write per line: torchrun's ranks share stdout, and a pipe keeps a short write whole."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def cmd_train(args) -> int:
    cfg = _config(args)
    if wants_launch(args):
        if args.gpus:
            import torch

            if torch.cuda.device_count() < args.gpus:
                raise TrainerInputError(f"--gpus {args.gpus}: this machine has {torch.cuda.device_count()} CUDA "
                                        f"devices (--nproc-per-node starts processes without asking for GPUs)")
        return launch(args, args.argv)
    code = None
    try:
        _record_node(Path(args.out))
        code = _train(args, cfg)
        return code
    finally:
        close_distributed(together=code == 0)


def _record_node(out: Path) -> None:
    """Under torchrun, local rank 0 writes OUT/node.json: which node this is in the rendezvous, and whether
    the run's writer (global rank 0, wherever the rendezvous put it) is here. envkit copies it to run.json."""
    if "GROUP_RANK" not in os.environ or os.environ.get("LOCAL_RANK") != "0":
        return
    import socket

    out.mkdir(parents=True, exist_ok=True)
    node = {"group_rank": int(os.environ["GROUP_RANK"]), "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")), "host": socket.gethostname(),
            "writer": os.environ.get("RANK") == "0",
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    atomic_write(out / "node.json", json.dumps(node, indent=2) + "\n")


def _train(args, cfg) -> int:
    from trainer.train.loop import Interrupted

    trainer = _make_trainer(args, cfg, _log_line)
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop_at_step_boundary(trainer, received))
    try:
        summary = trainer.train()
    except Interrupted:
        path = trainer.save_checkpoint()
        print(f"interrupted at step {trainer.step_count}; checkpoint {path}", flush=True)
        return 143 if received and received[0] == signal.SIGTERM else 130
    except Stop:
        kept = Path(args.out) / "checkpoint.pt"
        print(f"stopped at once by a {'second ' if len(received) > 1 else ''}signal; no checkpoint written"
              + (f" (the last one, {kept}, is untouched)" if kept.exists() else ""), flush=True)
        return 143 if received and received[0] == signal.SIGTERM else 130
    finally:
        trainer.close()
    write_summary(Path(args.out), summary)
    if not summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    print(json.dumps(summary), flush=True)
    print(headline(summary), flush=True)
    return 0


def write_summary(out: Path, summary: dict) -> None:
    """Results are a file: envkit reads summary.json, never the log."""
    if not summary:
        return
    atomic_write(out / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")


def cmd_eval(args) -> int:
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
    prompts = _walk_prompts(args.prompts, cfg) if args.prompts else None  # a bad file fails before the model is built
    trainer = Trainer.sequential(cfg, Path(args.ckpt).parent, device=args.device,
                                 log=lambda m: print(m, file=sys.stderr))
    trainer.load_state_dict(state)
    print(json.dumps(trainer.evaluate_walk(taps, args.zero_context, prompts) if args.walk else trainer.evaluate()))
    return 0


def _walk_prompts(path: str, cfg: TrainConfig) -> list[list[int]]:
    """--prompts read with the run's tokenizer (the data's, else the target's own; none for a random target)."""
    from trainer.data.rows import read_prompts
    from trainer.model.target import target_dir
    from trainer.train.setup import load_tokenizer

    tokenizer = load_tokenizer(cfg)
    if tokenizer is None and (directory := target_dir(cfg.target)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    prompts = read_prompts(path, tokenizer, cfg.data.chat_template_kwargs, cfg.walk_prompts)
    positions = cfg.target.max_position_embeddings
    too_long = [i for i, prompt in enumerate(prompts, 1) if len(prompt) + cfg.walk_new_tokens > positions]
    if too_long:
        raise TrainerInputError(f"--prompts {path}: prompt {too_long[0]} with {cfg.walk_new_tokens} new "
                                f"tokens exceeds the target's {positions} positions")
    return prompts


def cmd_export(args) -> int:
    """Write the DFlash serving format (config.json, model.safetensors, target/) from a checkpoint."""
    check_out(Path(args.out).absolute(), args.force)  # a refused --out costs no torch import, no checkpoint read
    from trainer.export.dflash import export

    def terminate(signum, frame):
        raise Stop  # unwinds through export(), which removes its temporary directory

    signal.signal(signal.SIGTERM, terminate)
    try:
        print(json.dumps(export(Path(args.ckpt), Path(args.out), force=args.force, dtype=args.dtype)))
    except Stop:
        print("Error: export stopped by SIGTERM; nothing was written", file=sys.stderr)
        return 143
    return 0


def cmd_warmup(args) -> int:
    """Compile every bucket single-threaded (what `envkit warm-cache` runs), then print the counters."""
    from trainer.train.loop import Trainer
    from trainer.metrics.monitor import inductor_cache_counters

    cfg = _config(args)
    _refuse_train_only_flags(args, "warmup")
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


TRAIN_ONLY_FLAGS = {"resume": "--resume", "gpus": "--gpus", "nproc_per_node": "--nproc-per-node",
                    "nnodes": "--nnodes", "node_rank": "--node-rank", "rdzv_endpoint": "--rdzv-endpoint",
                    "rdzv_id": "--rdzv-id", "max_restarts": "--max-restarts",
                    "strict_compile": "--strict-compile", "no_mitigations": "--no-mitigations", "fail_at": "--fail-at"}


def _refuse_train_only_flags(args, command: str) -> None:
    given = [flag for name, flag in TRAIN_ONLY_FLAGS.items() if getattr(args, name, None)]
    if given:
        raise TrainerInputError(f"{', '.join(given)} only apply to `train`, not `{command}`")


def _torch_build() -> dict:
    """torch's own account of its build and the device it would run on (an accelerator build needs torch)."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        device = f"{name} (sm_{''.join(map(str, torch.cuda.get_device_capability(0)))})"
    else:
        device = f"cpu ({torch.backends.cpu.get_cpu_capability()})"
    return {"torch": str(torch.__version__), "cuda": torch.version.cuda, "device": device}


def cmd_describe(args) -> int:
    """What decides compile-cache reuse here: versions, device, and the preset's compile-relevant config."""
    import platform
    from importlib import metadata

    cfg = _config(args)  # a bad config is answered before torch is read
    build = torch_build.without_import() or _torch_build()
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    print(json.dumps({**build, "triton": triton, "python": platform.python_version(), "preset": cfg.preset,
                      "config": cfg.compile_key(), "full_config": cfg.to_dict()}, sort_keys=True))
    return 0


def cmd_load_cache(args) -> int:
    """Load a Mega-Cache blob into the cache dirs named by TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR."""
    import hashlib

    import torch

    started = time.perf_counter()
    blob = Path(args.blob).read_bytes()
    # torch writes these artifacts and unpickles some (HAZARDS.md H5). Only envkit's `cache import` calls
    # this, after it checked the export against the user's pinned sha256, the blob against the header's
    # digest, and every artifact's kind, key and digest (envkit/cache/port.py, envkit/cache/megacache.py); the
    # digest it verified is checked again here, so bytes changed since then are never loaded.
    if hashlib.sha256(blob).hexdigest() != args.sha256:
        raise TrainerInputError(f"{args.blob} is not the blob envkit verified (sha256 differs); nothing loaded")
    # Unpickles: the blob was verified by envkit (pinned export, header, every artifact) and its sha256 is
    # rechecked just above, so only bytes produced or verified by envkit reach torch's loader.
    info = torch.compiler.load_cache_artifacts(blob)
    counts = {kind: len(keys) for kind, keys in info.artifacts.items()} if info is not None else {}
    print(json.dumps({"loaded": bool(counts and any(counts.values())), "artifacts": counts,
                      "seconds": round(time.perf_counter() - started, 2)}))
    return 0


def cmd_selftest(args) -> int:
    """Prove each hazard mitigation in this interpreter (what `envkit warm-cache` records for doctor)."""
    import torch

    from trainer.safety.selftest import run_all

    started = time.perf_counter()
    results = run_all()
    print(json.dumps({"torch": str(torch.__version__), "results": results,
                      "seconds": round(time.perf_counter() - started, 2)}))
    return 0 if all(result["passed"] for result in results.values()) else 1


def cmd_prepare(args) -> int:
    """The data file's token store, prepared now or found intact (trainer/data/store.py)."""
    from trainer.data import store
    from trainer.train.setup import tokenizer_source
    from trainer.model.target import target_dir

    cfg = _config(args)
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
        store.open_store(Path(prepared.store), verify=True)
        store.verify_source(Path(prepared.store), Path(cfg.data.path))
    result = dataclasses.asdict(prepared) | {"verified": bool(args.verify)}
    if args.json:
        print(json.dumps(result))
    else:
        how = "reused" if prepared.reused else f"prepared in {prepared.seconds:.1f}s ({prepared.rows_per_s:,.0f} rows/s)"
        print(f"{prepared.store}: {prepared.rows:,} rows, {prepared.tokens:,} tokens, {prepared.skipped} malformed "
              f"lines skipped, {prepared.untrainable} with nothing supervised; {how}"
              + ("; every file and the source re-hashed and intact" if args.verify else ""))
    return 0


def cmd_make_target(args) -> int:
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


def cmd_convert_gguf(args) -> int:
    from trainer.targets.gguf import cmd_convert_gguf as convert

    return convert(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    # One flag set for train, warmup and describe, so that envkit hands a run's arguments to each; flags that
    # do not decide the config (devices, threads) only matter to train.
    helps = {"train": "train a DFlash drafter (the run dir gets metrics.jsonl, checkpoint.pt, summary.json)",
             "warmup": "compile every length bucket single-threaded into the compile cache (envkit warm-cache)",
             "describe": "print the resolved config and what decides the compile cache's key (JSON)",
             "prepare": "tokenize a data file once into a memory-mapped token store that runs reuse (JSON with --json)"}
    for name in ("train", "warmup", "describe", "prepare"):
        p = sub.add_parser(name, allow_abbrev=False, help=helps[name], description=helps[name])
        p.add_argument("--preset", help=" | ".join(PRESETS) + " (tiny the default)")
        p.add_argument("--config", help="a JSON config: a full one (a run's config.json), or a preset's changes "
                                        "({\"preset\": \"tiny\", \"steps\": 50}); flags override it")
        p.add_argument("--out", required=name in ("train", "warmup"), help="run directory (metrics.jsonl, checkpoint.pt)")
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
        if name == "warmup":
            p.add_argument("--export", help="after warming, write torch's Mega-Cache blob to this file")
        if name == "prepare":
            p.add_argument("--json", action="store_true", help="print the store, its counts, seconds, reused")
            p.add_argument("--verify", action="store_true", help="re-hash every file of the store against its manifest")
    p = sub.add_parser("load-cache", help="load a verified Mega-Cache blob into the compile cache (envkit's `cache "
                                          "import` calls it, after verification)")
    p.add_argument("blob")
    p.add_argument("--sha256", required=True, help="the digest envkit verified the blob against")
    sub.add_parser("selftest", help="reproduce each torch hazard with its mitigation off, then prove the "
                                    "mitigation removes it (JSON; exit 1 when one fails)")
    p = sub.add_parser("make-target", help="train a small Qwen3 target and tokenizer on this interpreter's stdlib "
                                           "sources (the `code` preset's target)")
    p.add_argument("--recipe", default="code_tiny", help="code_tiny (CPU, ~1 min) | code_small (one GPU)")
    p.add_argument("--out", help="directory to create (default: built once into $ENVKIT_HOME/targets and reused)")
    p.add_argument("--seed", type=int, default=0, help="the weights' and batches' seed (0: the recipe as shipped)")
    p = sub.add_parser("convert-gguf", help="dequantize a GGUF model file into a Hugging Face model dir (safetensors, "
                                            "tokenizer, chat template); needs the convert-cpu lock's gguf and accelerate")
    p.add_argument("--gguf", required=True, help="the .gguf file")
    p.add_argument("--out", required=True, help="the model dir to write (must not exist)")
    p = sub.add_parser("eval", help="re-evaluate a checkpoint: teacher-forced tau, or the decoding walk (--walk)")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--device")
    p.add_argument("--walk", action="store_true",
                   help="acceptance length by a greedy speculative decoding walk (else teacher-forced)")
    p.add_argument("--taps", metavar="L[,L...]", help="ablation: feed the drafter these target layers' states "
                                                      "instead of those it was trained on (a tap error)")
    p.add_argument("--zero-context", action="store_true",
                   help="ablation: feed the drafter all-zero context features")
    p.add_argument("--prompts", metavar="FILE",
                   help="walk on your own prompts (JSONL: prompt or text strings, or conversations rendered with the "
                        "run's chat template kwargs) instead of the held-out rows; the first walk_prompts of them")
    p = sub.add_parser("export", help="write the DFlash serving format (SGLang, vLLM, dflash) from a checkpoint")
    p.add_argument("--ckpt", required=True, help="RUN_DIR/checkpoint.pt")
    p.add_argument("--out", required=True, help="directory to create (refused when not empty, unless --force)")
    p.add_argument("--force", action="store_true", help="replace a previous export at --out")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype (default: the training dtype)")
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
        commands = {"train": cmd_train, "eval": cmd_eval, "warmup": cmd_warmup, "describe": cmd_describe,
                    "load-cache": cmd_load_cache, "export": cmd_export, "selftest": cmd_selftest,
                    "make-target": cmd_make_target, "prepare": cmd_prepare, "convert-gguf": cmd_convert_gguf}
        return commands[args.command](args)
    except TrainerInputError as exc:  # anything else is a bug or torch's failure: its traceback is kept
        print(f"Error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
