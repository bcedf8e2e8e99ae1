"""Training throughput of a preset after warm-up: tokens/s, MFU, step time, peak memory, compile health.

    python bench/train_throughput.py --preset qwen3_8b --variants flex,flex-eager,sdpa --steps 12
    python bench/train_throughput.py --preset tiny --variants sdpa --steps 50          # CPU

Each variant runs in its own process (fresh compile state, an OOM stays contained):
flex = compiled flex_attention, flex-eager = flex_attention without torch.compile (HAZARDS.md H8),
sdpa = compiled model with SDPA and a dense mask. --targets/--drafters run the threaded pipeline.
Prints one JSON line per variant and a table side by side; --out writes the JSON lines to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

VARIANTS = {"flex": ("flex", True), "flex-eager": ("flex", False), "sdpa": ("sdpa", True)}


def run_variant(args) -> dict:
    """In this process: build the trainer, warm up, train N steps, summarise the step rows."""
    import torch

    from trainer.config.schema import preset
    from trainer.train.faults import Faults
    from trainer.metrics.flops import sequence_flops, useful_flops
    from trainer.train.launcher import init_distributed
    from trainer.train.loop import Trainer

    attention, compiled = VARIANTS[args.variant]
    cfg = preset(args.preset)
    cfg.attention, cfg.compile = attention, compiled
    cfg.steps = args.steps + args.skip + args.profile_steps  # the profiled steps, if any, come last
    cfg.eval_every = cfg.ckpt_every = 0
    cfg.log_every = max(1, cfg.steps)
    if args.buckets:
        cfg.data.buckets = [int(b) for b in args.buckets.split(",")]
    if args.batch_size:
        cfg.batch_size = args.batch_size
    if args.num_anchors:
        cfg.num_anchors = args.num_anchors
    cfg.data.num_sequences = args.num_sequences or max(8, cfg.batch_size * 4)
    cfg.data.eval_sequences = 1
    if args.data_source:
        cfg.data.source = args.data_source
    if args.packing is not None:
        cfg.data.packing = args.packing
    if args.fp8:
        cfg.fp8 = args.fp8
    if args.fused is not None:
        cfg.fused_optimizer = args.fused
    if args.compile_target is not None:
        cfg.compile_target = args.compile_target
    out = Path(tempfile.mkdtemp(prefix="envkit-bench-tp-"))
    started = time.perf_counter()
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    dist = init_distributed()
    if dist:  # under torchrun (--processes): one process per GPU, a target worker and a drafter replica in each
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
        trainer = Trainer.threaded(cfg, out, targets=[device], drafters=[device], log=log, dist=dist)
    elif args.targets or args.drafters:
        unwarmed = tuple(int(b) for b in args.unwarmed.split(",")) if args.unwarmed else ()
        trainer = Trainer.threaded(cfg, out, targets=args.targets.split(","), drafters=args.drafters.split(","),
                                   mitigations=not args.no_mitigations, log=log,
                                   faults=Faults.parse(unwarmed=unwarmed))
    else:
        trainer = Trainer.sequential(cfg, out, device=args.device, log=log)
    replicas = len(trainer.setup.replicas)
    setup_s = time.perf_counter() - started
    warm_started = time.perf_counter()
    trainer.warmup()
    warmup_s = time.perf_counter() - warm_started
    profile = None
    try:
        if args.profile_steps:
            from step_profile import group_kernels, kernels_of

            rows = [trainer.step() for _ in range(cfg.steps - args.profile_steps)]
            activities = [torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            with torch.profiler.profile(activities=activities) as profiler:
                for _ in range(args.profile_steps):  # profiled steps are slower: not among the measured rows
                    trainer.step()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            profile = group_kernels(kernels_of(profiler), args.profile_steps)
            rows = rows[args.skip:]
        else:
            rows = [trainer.step() for _ in range(cfg.steps)][args.skip:]
    except Exception as exc:  # the unmitigated race: report it as the result
        return {"variant": args.variant, "mitigations": not args.no_mitigations, "replicas": replicas,
                "error": [f"{type(exc).__name__}: {str(exc)[:300]}"]}
    finally:
        trainer.close()
    device = trainer.setup.device
    world = dist.get_world_size() if dist else 1
    if dist and dist.get_rank() != 0:
        return {}
    step_tokens = [cfg.batch_size * replicas * world * r["bucket"] for r in rows]
    step_s = [tokens / r["tokens_per_s"] for tokens, r in zip(step_tokens, rows)]
    flops = [cfg.batch_size * replicas * world * sequence_flops(cfg, r["bucket"])["total"] for r in rows]
    useful = [r["useful_tokens_per_s"] * s for r, s in zip(rows, step_s)]
    # Useful-token FLOPs: padding, attention across documents and unplaced anchors count nothing.
    flops_useful = [useful_flops(cfg, int(u), r["doc_tokens_sq"], r["anchors"]) for u, r in zip(useful, rows)]
    peaks = [r["peak_mem_bytes"] if isinstance(r["peak_mem_bytes"], int) else max(r["peak_mem_bytes"].values())
             for r in rows]
    tokens_per_s = sum(step_tokens) / sum(step_s)
    achieved = sum(flops) / sum(step_s)
    achieved_useful = sum(flops_useful) / sum(step_s)
    peak_tflops = args.peak_tflops if args.peak_tflops else (790.0 if device.type == "cuda" else None)
    # MFU is per GPU: the achieved rate over the peak of every distinct device the run used.
    gpus = world * (len({d for d in (args.targets + "," + args.drafters).split(",") if d}) or 1)
    return {
        "variant": args.variant, "preset": args.preset, "device": torch.cuda.get_device_name(0)
        if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "triton": _version("triton"), "steps": len(rows), "batch_size": cfg.batch_size, "num_anchors": cfg.num_anchors,
        "buckets": cfg.data.buckets, "replicas": replicas, "world_size": world,
        "mitigations": not args.no_mitigations,
        "data_source": cfg.data.source, "packing": cfg.data.packing, "tokens_per_s": round(tokens_per_s, 1),
        "useful_tokens_per_s": round(sum(useful) / sum(step_s), 1),
        "pad_fraction": round(1 - sum(useful) / sum(step_tokens), 4),
        "tflops_per_s": round(achieved / 1e12, 1), "useful_tflops_per_s": round(achieved_useful / 1e12, 1),
        "gpus": gpus, "mfu": round(achieved / (gpus * peak_tflops * 1e12), 4) if peak_tflops else None,
        "useful_mfu": round(achieved_useful / (gpus * peak_tflops * 1e12), 4) if peak_tflops else None,
        "step_s_median": round(statistics.median(step_s), 4),
        "step_s_p90": round(sorted(step_s)[int(0.9 * (len(step_s) - 1))], 4),
        "peak_mem_gib_min": round(min(peaks) / 2**30, 2), "peak_mem_gib_max": round(max(peaks) / 2**30, 2),
        "eager_fallbacks": rows[-1]["eager_fallbacks"], "recompiles": rows[-1]["recompiles"],
        "setup_s": round(setup_s, 1), "warmup_s": round(warmup_s, 1),
        "flops_per_sequence_tflop": round(sequence_flops(cfg, cfg.data.buckets[-1])["total"] / 1e12, 1),
        "fp8": cfg.fp8, "fused_optimizer": cfg.fused_optimizer, "compile_target": cfg.compile_target, "loss_last": round(statistics.mean(
            r["loss"] for r in rows[-3:]), 5), "losses": [r["loss"] for r in rows], "profile": profile,
    }


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--variants", default="sdpa", help="comma list of: " + ", ".join(VARIANTS))
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in the child process
    parser.add_argument("--steps", type=int, default=10, help="measured steps after warm-up")
    parser.add_argument("--skip", type=int, default=2, help="steps run but not measured")
    parser.add_argument("--buckets", help="comma list of length buckets to use instead of the preset's")
    parser.add_argument("--unwarmed", help="threaded only: buckets left out of warm-up (a dataset that grew)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--num-anchors", type=int)
    parser.add_argument("--device")
    parser.add_argument("--data-source", choices=["random", "chat_lengths", "generate"],
                        help="chat_lengths: a log-normal length mix (median 800, p90 2500 tokens)")
    parser.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--num-sequences", type=int, help="training sequences to draw (default: 4 batches)")
    parser.add_argument("--targets", default="")
    parser.add_argument("--drafters", default="")
    parser.add_argument("--processes", type=int, default=1,
                        help="processes under torchrun, one GPU each (data parallel across processes)")
    parser.add_argument("--no-mitigations", action="store_true")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default 790 on CUDA: H200 bf16)")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument("--fp8", choices=["off", "target", "drafter", "both"])
    parser.add_argument("--fused", action=argparse.BooleanOptionalAction, default=None,
                        help="AdamW's fused kernel (default: on CUDA)")
    parser.add_argument("--compile-target", action=argparse.BooleanOptionalAction, default=None,
                        help="the frozen target's layers compiled (default: on CUDA with compile)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="profile the last N steps and group the kernels (bench/step_profile.py)")
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    if args.variant:
        result = run_variant(args)
        if result:  # torchrun ranks other than 0 report nothing
            print(json.dumps(result), flush=True)
        return
    results = []
    passthrough = [a for a in sys.argv[1:]]
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, *passthrough, "--variant", variant]
        if args.processes > 1:
            cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.processes)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=PROJECT,
                                  env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                      p for p in (str(PROJECT), os.environ.get("PYTHONPATH")) if p)))
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            result = json.loads(lines[-1]) if proc.returncode == 0 and lines else \
                {"variant": variant, "error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            result = {"variant": variant, "error": [f"timed out after {args.timeout}s"],
                      "stderr_tail": stderr.strip().splitlines()[-12:]}
        results.append(result)
        print(json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(json.dumps(result) + "\n")
    keys = ["tokens_per_s", "useful_tokens_per_s", "pad_fraction", "mfu", "useful_mfu", "tflops_per_s",
            "step_s_median", "step_s_p90", "peak_mem_gib_min", "peak_mem_gib_max", "eager_fallbacks", "recompiles",
            "warmup_s", "fp8", "loss_last"]
    print(f"{'':18}" + "".join(f"{r['variant']:>14}" for r in results))
    for key in keys:
        print(f"{key:18}" + "".join(f"{str(r.get(key, r.get('error', '-')))[:13]:>14}" for r in results))
    for result in results:
        if result.get("profile"):
            from step_profile import render

            print(f"\n{result['variant']} (fp8 {result.get('fp8')}): step profile\n{render(result['profile'])}")


if __name__ == "__main__":
    main()
