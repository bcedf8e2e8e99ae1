"""Data at the seed's scale: a chat-mix JSONL of pre-tokenized rows and a set of conversations prepared into token
stores, then read by the trainer; beside today's path (every row parsed into Python lists) on the smaller file.

    python bench/data_scale.py [--rows 1100000] [--small-rows 110000] [--conversations 110000] [--workdir DIR]

Prints one JSON line per measurement and a table. Rows follow the chat length mix (log-normal, median 800,
p90 2,500 tokens; token ids of the tiny target's 512-token vocabulary); conversations (3 turns) go through a
Qwen-style chat template on the code target's tokenizer. Peak memory while preparing is the
sum of the resident sets of the preparing process and its workers, sampled ten times a second (pages they
share counted in each: an upper bound); RSS per rank is what each of two CPU ranks under torchrun
reports in its summary after 3 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROJECT = Path(__file__).resolve().parent.parent
QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONFIG = {"preset": "tiny", "compile": False, "eval_every": 0, "log_every": 1, "walk_prompts": 1,
          "walk_new_tokens": 4, "batch_size": 4, "data": {"buckets": [1024, 2048], "eval_sequences": 4}}


def write_chat_mix(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    sigma = np.log(2500 / 800) / 1.2816
    with path.open("w") as handle:
        for start in range(0, rows, 10_000):
            lengths = np.maximum(16, np.exp(np.log(800) + sigma * rng.standard_normal(min(10_000, rows - start))))
            lines = []
            for length in lengths.astype(int):
                ids = rng.integers(1, 511, length).tolist()
                prompt = min(32, length // 4)
                lines.append(json.dumps({"input_ids": ids, "loss_mask": [0] * prompt + [1] * (length - prompt)},
                                        separators=(",", ":")))
            handle.write("\n".join(lines) + "\n")


def write_conversations(path: Path, count: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = ["def", "return", "import", "class", "self", "value", "list", "for", "in", "if", "else", "print",
             "data", "path", "open", "read", "write", "json", "time", "error"]
    with path.open("w") as handle:
        for _ in range(count):
            def say(n):
                return " ".join(words[i] for i in rng.integers(0, len(words), n))
            turns = [{"role": "user", "content": say(int(rng.integers(5, 60)))},
                     {"role": "assistant", "content": say(int(rng.integers(20, 300)))},
                     {"role": "user", "content": say(int(rng.integers(5, 40)))},
                     {"role": "assistant", "content": say(int(rng.integers(20, 300)))}]
            handle.write(json.dumps({"conversations": turns}) + "\n")


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (workers included), from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = (int(fields[1]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, IndexError, ValueError):
            continue
    family = {pid}
    for _ in range(8):  # depth: bench -> trainer -> forkserver -> workers
        family |= {child for child, (parent, _rss) in parents.items() if parent in family}
    return sum(parents[p][1] for p in family if p in parents)


def timed(cmd: list[str], env: dict) -> tuple[float, str, int]:
    """Wall seconds, stdout, and the peak resident bytes of the command's whole process tree (sampled 10x/s)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=PROJECT, env=env)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        out.seek(0), err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read()[-3000:]}")
        return seconds, out.read(), peak


def prepare(data: Path, env: dict, *extra: str) -> dict:
    seconds, stdout, peak = timed([sys.executable, "-m", "trainer", "prepare", "--data", str(data), "--json", *extra],
                                  env)
    return json.loads(stdout.strip().splitlines()[-1]) | {"wall_s": round(seconds, 1), "peak_rss_bytes": peak}


def first_step(data: Path, env: dict, workdir: Path, name: str) -> float:
    """Seconds from start-up to the first training step's metrics row (the store prepared; the plan as found)."""
    config = workdir / "bench-config.json"
    config.write_text(json.dumps(CONFIG | {"steps": 2}))
    out = workdir / f"first-{name}"
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config), "--data", str(data),
                             "--out", str(out)], cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and '"loss"' in metrics.read_text():
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    proc.wait()
    return round(seconds, 2)


def rss_per_rank(data: Path, env: dict, workdir: Path, name: str) -> dict:
    config = workdir / "bench-config.json"
    config.write_text(json.dumps(CONFIG | {"steps": 3}))
    out = workdir / f"ranks-{name}"
    shutil.rmtree(out, ignore_errors=True)
    timed([sys.executable, "-m", "trainer", "train", "--config", str(config), "--data", str(data), "--out", str(out),
           "--nproc-per-node", "2"], env)
    return json.loads((out / "summary.json").read_text())["peak_rss_bytes_by_rank"]


def todays_path(data: Path) -> dict:
    """What the trainer did before the store, in this process: every row parsed into lists, then packed."""
    sys.path.insert(0, str(PROJECT))
    from trainer.data.datasets import pack

    started = time.perf_counter()
    rows = []
    with data.open("rb") as handle:
        for line in handle:
            row = json.loads(line)
            rows.append((row["input_ids"], row["loss_mask"]))
    pack([len(ids) for ids, _mask in rows], 2048)
    return {"seconds": round(time.perf_counter() - started, 1),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rows": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_100_000)
    parser.add_argument("--small-rows", type=int, default=110_000)
    parser.add_argument("--conversations", type=int, default=110_000)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="envkit-bench-data-"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ENVKIT_HOME=str(workdir / "home"), PYTHONPATH=str(PROJECT))
    results = {"cores": os.cpu_count()}

    small, large = workdir / "chat-small.jsonl", workdir / "chat-large.jsonl"
    for path, rows in ((small, args.small_rows), (large, args.rows)):
        if not path.exists():
            write_chat_mix(path, rows)
    for name, path in (("small", small), ("large", large)):
        prepared = prepare(path, env, "--preset", "tiny")
        results[f"prepare_{name}"] = prepared
        print(json.dumps({f"prepare_{name}": prepared}), flush=True)
        results[f"first_step_{name}_plan_cold_s"] = first_step(path, env, workdir, name)
        results[f"first_step_{name}_s"] = first_step(path, env, workdir, name)
        results[f"rss_per_rank_{name}"] = rss_per_rank(path, env, workdir, name)
        print(json.dumps({k: v for k, v in results.items() if name in k}), flush=True)
    results["todays_path_small"] = todays_path(small)
    print(json.dumps({"todays_path_small": results["todays_path_small"]}), flush=True)

    if args.conversations:
        tokenizer = workdir / "tokenizer"
        if not tokenizer.exists():
            target = json.loads(subprocess.run([sys.executable, "-m", "trainer", "make-target", "--recipe", "code_tiny"],
                                               capture_output=True, text=True, cwd=PROJECT, env=env,
                                               check=True).stdout)["out"]
            from transformers import AutoTokenizer

            loaded = AutoTokenizer.from_pretrained(target)
            loaded.chat_template = QWEN_TEMPLATE
            loaded.save_pretrained(tokenizer)
        conversations = workdir / "conversations.jsonl"
        if not conversations.exists():
            write_conversations(conversations, args.conversations)
        results["prepare_conversations"] = prepare(conversations, env, "--preset", "code", "--tokenizer",
                                                   str(tokenizer))
        print(json.dumps({"prepare_conversations": results["prepare_conversations"]}), flush=True)

    mib = 2 ** 20
    print(f"\n{'':34} {'small':>14} {'large':>14}")
    for label, key in (("rows", "rows"), ("prepare wall s", "wall_s"), ("rows/s", "rows_per_s")):
        print(f"{label:34} {results['prepare_small'][key]:>14,} {results['prepare_large'][key]:>14,}")
    print(f"{'peak MiB while preparing':34} {results['prepare_small']['peak_rss_bytes'] / mib:>14,.0f} "
          f"{results['prepare_large']['peak_rss_bytes'] / mib:>14,.0f}")
    for label, key in (("first step s (plan cold)", "first_step_{}_plan_cold_s"), ("first step s", "first_step_{}_s")):
        print(f"{label:34} {results[key.format('small')]:>14} {results[key.format('large')]:>14}")
    for rank in ("rank0", "rank1"):
        print(f"{'RSS MiB per rank, ' + rank:34} {results['rss_per_rank_small'][rank] / mib:>14,.0f} "
              f"{results['rss_per_rank_large'][rank] / mib:>14,.0f}")
    today = results["todays_path_small"]
    print(f"today's path on the small file: {today['seconds']} s, {today['peak_rss_bytes'] / mib:,.0f} MiB")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
