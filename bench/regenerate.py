"""Regeneration throughput: `envkit data regenerate` through `transformers serve` (plain, and with
`--continuous-batching`) against the trainer's own in-process greedy generation of the same prompts.

Rows/s and generated tok/s, each the median of --repeat runs; the in-process figure runs in the training venv's
interpreter (--train-python), the servers from the serve venv (--serve-venv), on the same target and prompts.

    python3 bench/regenerate.py --serve-venv .venv-serve --train-python .venv-train/bin/python --target DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from trainer.data import corpus  # noqa: E402

IN_PROCESS = """
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trainer.eval.walk import greedy_continuations
target_dir, prompts_path, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(target_dir)
target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
prompts = [tokenizer(json.loads(l)["prompt"], add_special_tokens=False)["input_ids"] for l in open(prompts_path)]
started = time.perf_counter()
with torch.no_grad():
    tokens = sum(len(g) for _, g, _ in greedy_continuations(target, prompts, new_tokens))
print(json.dumps({"seconds": time.perf_counter() - started, "tokens": tokens, "rows": len(prompts)}))
"""


def envkit(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envkit", *args], capture_output=True, text=True, **kwargs)


def through_server(serve_venv: str, target: str, prompts: Path, work: Path, new_tokens: int, concurrency: int,
                   port: int, engine_args: list[str], repeat: int) -> list[dict]:
    name = f"bench-regen-{port}"
    started = envkit("serve", "--venv", serve_venv, "--model", target, "--port", str(port), "--name", name,
                     "--detach", "--", *engine_args)
    if started.returncode != 0:
        raise SystemExit(started.stderr[-3000:])
    try:
        runs = []
        for index in range(repeat):
            out = work / f"regen-{port}-{index}.jsonl"
            for stale in (out, out.with_name(out.name + ".manifest.json")):
                stale.unlink(missing_ok=True)
            done = envkit("data", "regenerate", "--server", f"http://127.0.0.1:{port}", "--data", str(prompts),
                          "--out", str(out), "--max-tokens", str(new_tokens), "--concurrency", str(concurrency),
                          "--json")
            if done.returncode != 0:
                raise SystemExit(done.stderr[-3000:])
            runs.append(json.loads(done.stdout))
        return runs
    finally:
        envkit("serve", "--stop", name)


def in_process(train_python: str, target: str, prompts: Path, new_tokens: int, repeat: int) -> list[dict]:
    runs = []
    for _ in range(repeat):
        proc = subprocess.run([train_python, "-c", IN_PROCESS, target, str(prompts), str(new_tokens)],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(PROJECT)))
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-3000:])
        row = json.loads(proc.stdout)
        runs.append({"rows_per_s": row["rows"] / row["seconds"], "tokens_per_s": row["tokens"] / row["seconds"]})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve-venv", required=True)
    parser.add_argument("--train-python", required=True, help="the training venv's interpreter (in-process figure)")
    parser.add_argument("--target", required=True, help="the model dir served and generated from")
    parser.add_argument("--prompts", type=int, default=128, help="held-out docstring-led function openings")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", default="/tmp/envkit-bench-regenerate")
    args = parser.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in corpus.function_openings(True, args.prompts, 0)))
    results = {
        "serve": through_server(args.serve_venv, args.target, prompts, work, args.new_tokens, args.concurrency, 18411,
                                [], args.repeat),
        "serve --continuous-batching": through_server(args.serve_venv, args.target, prompts, work, args.new_tokens,
                                                      args.concurrency, 18412, ["--continuous-batching"], args.repeat),
        "in-process greedy": in_process(args.train_python, args.target, prompts, args.new_tokens, args.repeat),
    }
    base = statistics.median(run["tokens_per_s"] for run in results["in-process greedy"])
    print(f"{'path':<30} {'rows/s':>8} {'gen tok/s':>10} {'vs in-process':>14}   ({args.prompts} prompts x "
          f"{args.new_tokens} tokens, concurrency {args.concurrency}, median of {args.repeat})")
    for label, runs in results.items():
        rows = statistics.median(run["rows_per_s"] for run in runs)
        tokens = statistics.median(run["tokens_per_s"] for run in runs)
        print(f"{label:<30} {rows:>8.2f} {tokens:>10.0f} {tokens / base:>13.2f}x")


if __name__ == "__main__":
    main()
