"""The recipe's point, measured: a drafter trained on the target's own answers to the user's kind of prompt against
the preset's default drafter, the same steps, both walked on prompts of that kind cut from held-out files.

A: the preset's drafter (its data: the target's greedy continuations of random windows of the training files).
B: the same, trained on `prompt`/`completion` rows: docstring-led function openings cut from the training files,
   answered by the target (through a server, `--via serve`, as `envkit data regenerate` does; or in this process,
   `--via in-process`, which tests/envkit/test_serve.py shows is the same tokens).
Both walks run on docstring-led openings from held-out files; prompts the target continues degenerately are
counted and left out (the walk's rule). Run it with an interpreter that has the trainer's torch and transformers:

    .venv-train/bin/python bench/recipe.py --config code --openings 2048 --steps 1500            # CPU, code_tiny
    python3 bench/recipe.py --config bench/gpu/code_small.json --via in-process --openings 2048  # a GPU, code_small

Prints one JSON line per step and the figures last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from trainer.common.notices import filter_known_notices  # noqa: E402
from trainer.data import corpus  # noqa: E402


def trainer(*args: str, timeout: float = 3600) -> str:
    env = dict(os.environ, PYTHONPATH=str(PROJECT), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=PROJECT)
    if proc.returncode != 0:
        raise SystemExit(f"python -m trainer {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def in_process(target_dir: Path, prompts: list[str], new_tokens: int, batch: int = 64) -> list[dict]:
    """The target's greedy continuation of each prompt, decoded: what a server at temperature 0 answers. Prompts of
    every length decode together, left-padded (the trainer's own decoder batches equal lengths only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(target_dir, padding_side="left")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16 if device == "cuda" else None)
    target = target.to(device).eval()
    rows = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            encoded = tokenizer(chunk, add_special_tokens=False, return_tensors="pt", padding=True).to(device)
            out = target.generate(**encoded, max_new_tokens=new_tokens, do_sample=False,
                                  pad_token_id=tokenizer.pad_token_id)
            for prompt, ids in zip(chunk, out[:, encoded["input_ids"].shape[1]:].tolist()):
                completion = tokenizer.decode(ids, skip_special_tokens=True)
                rows.append({"prompt": prompt, "completion": completion, "text": prompt + completion})
    return rows


def via_server(envkit: list[str], serve_venv: str, target_dir: Path, prompts: Path, out: Path, new_tokens: int,
               port: int) -> dict:
    name = f"recipe-{os.getpid()}"
    subprocess.run([*envkit, "serve", "--venv", serve_venv, "--model", str(target_dir), "--port", str(port),
                    "--name", name, "--detach"], check=True)
    try:
        started = time.perf_counter()
        subprocess.run([*envkit, "data", "regenerate", "--server", f"http://127.0.0.1:{port}", "--data", str(prompts),
                        "--out", str(out), "--max-tokens", str(new_tokens), "--concurrency", "8"], check=True)
        return {"regenerate_s": round(time.perf_counter() - started, 1)}
    finally:
        subprocess.run([*envkit, "serve", "--stop", name], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="code", help="preset name or a config JSON (default: code)")
    parser.add_argument("--openings", type=int, default=2048, help="training openings regenerated")
    parser.add_argument("--held-out", type=int, default=64, help="held-out openings walked")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens each answer and each walk has")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--via", choices=["serve", "in-process"], default="serve")
    parser.add_argument("--serve-venv", help="--via serve: the serve venv (envkit create --profile serve-cpu)")
    parser.add_argument("--envkit", default="python3 -m envkit", help="how to run envkit (--via serve)")
    parser.add_argument("--port", type=int, default=18321)
    parser.add_argument("--work", default="/tmp/envkit-recipe", help="working dir (runs, prompts, data)")
    parser.add_argument("--extra", default="", help="more trainer flags for both runs, e.g. --no-compile")
    parser.add_argument("--reuse", action="store_true", help="keep WORK/regenerated.jsonl from an earlier run")
    args = parser.parse_args()
    filter_known_notices()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    base = json.loads(Path(args.config).read_text()) if args.config.endswith(".json") else {"preset": args.config}
    config = base | {"walk_prompts": args.held_out, "walk_new_tokens": args.new_tokens}
    figures: dict = {"config": args.config, "via": args.via, "openings": args.openings, "steps": args.steps}

    built = json.loads(trainer("make-target", "--recipe", config.get("target", {}).get("recipe", "code_tiny")))
    target_dir = Path(built["out"])
    figures["target"] = {k: built[k] for k in ("recipe", "held_out_loss")}
    train_openings = corpus.function_openings(False, args.openings, seed=0)
    held_prompts = write_rows(work / "held-out.jsonl",
                              [{"prompt": p} for p in corpus.function_openings(True, args.held_out, seed=0)])
    regenerated = work / "regenerated.jsonl"
    started = time.perf_counter()
    if args.reuse and regenerated.exists():
        figures["regenerate_s"] = "reused"
    elif args.via == "in-process":
        write_rows(regenerated, in_process(target_dir, train_openings, args.new_tokens))
        figures["regenerate_s"] = round(time.perf_counter() - started, 1)
    else:
        if regenerated.exists():
            regenerated.unlink()
            regenerated.with_name(regenerated.name + ".manifest.json").unlink(missing_ok=True)
        prompts = write_rows(work / "openings.jsonl", [{"prompt": p} for p in train_openings])
        figures |= via_server(args.envkit.split(), args.serve_venv, target_dir, prompts, regenerated, args.new_tokens,
                              args.port)
    print(json.dumps({"regenerated": str(regenerated), **figures}), flush=True)

    for label, data in (("default", None), ("regenerated", regenerated)):
        run = work / f"run-{label}"
        cfg_path = work / f"{label}.json"
        cfg_path.write_text(json.dumps(config | ({"data": {**config.get("data", {}), "path": str(data)}} if data else {})))
        started = time.perf_counter()
        trainer("train", "--config", str(cfg_path), "--out", str(run), "--steps", str(args.steps),
                *args.extra.split())
        walked = json.loads(trainer("eval", "--ckpt", str(run / "checkpoint.pt"), "--walk", "--prompts",
                                    str(held_prompts)).strip().splitlines()[-1])
        figures[label] = {k: walked[k] for k in ("walk_tau", "walk_repeat_tau", "walk_copy_tau", "walk_degenerate",
                                                 "walk_counted", "walk_near_ties")}
        figures[label]["train_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps({label: figures[label]}), flush=True)
    figures["ratio"] = round(figures["regenerated"]["walk_tau"] / figures["default"]["walk_tau"], 3)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
