"""The chat recipe on the device: SmolLM2-135M-Instruct answering instructions, its drafter trained on those
answers, walked on held-out instructions through the chat template.

    python bench/gpu/chat_recipe.py --gguf-parts .gguf/part-* --work /tmp/chat --out $OUT [--train 8000]
        [--steps N] [--batch-size B] [--drafter-layers L] [--run NAME]

The GGUF travels in parts (the device carries 64 MiB a call): a call with --stash only copies the parts it was given
into --work; the next call joins them. The training instructions are drawn evenly from every kind
`envkit data instructions --kind` writes (trainer/data/corpus.py), the held-out ones are the walk's kind,
"Write a Python function", from held-out files. The answers are the target's greedy answers, generated here in
batches with transformers (no serving engine on the device); on CPU the same answers come through `envkit serve`
and `envkit data regenerate` (tests/envkit/test_chat_target.py). They are kept in --work (and a copy in OUT), so a
later call on the same machine trains another run (--run) on them without answering again. Figures go to
OUT/chat_recipe-RUN.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))


def answers(target: Path, instructions: list[str], max_new_tokens: int, batch: int) -> tuple[list[str], dict]:
    """The target's greedy answers through the trainer's batched decoder (trainer/data/greedy_decode.py, the walk's),
    batches of like lengths; figures: seconds and generated tokens per second."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.data.greedy_decode import padded_greedy

    tokenizer = AutoTokenizer.from_pretrained(target)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke run of the script itself
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).to(device).eval()
    stops = tuple({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None})
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"] for text in instructions]
    started = time.perf_counter()

    def progress(done: int, total: int, tokens: int) -> None:
        rate = tokens / (time.perf_counter() - started)
        print(f"answered {done} of {total}: {tokens:,} tokens, {rate:,.0f} tokens/s", file=sys.stderr, flush=True)

    decoded = padded_greedy(model, prompts, max_new_tokens, batch, stop_ids=stops, by_length=True, progress=progress)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens = sum(map(len, decoded))
    figures = {"seconds": round(seconds, 1), "generated_tokens": tokens, "tokens_per_s": round(tokens / seconds),
               "batch": batch, "max_new_tokens": max_new_tokens,
               "hit_max": sum(len(row) == max_new_tokens for row in decoded)}
    return [tokenizer.decode(row, skip_special_tokens=True) for row in decoded], figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf-parts", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/chat"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--stash", action="store_true")
    parser.add_argument("--train", type=int, default=8000, help="training instructions (at most all there are)")
    parser.add_argument("--held-out", type=int, default=64)
    parser.add_argument("--answer-tokens", type=int, default=256)
    parser.add_argument("--answer-batch", type=int, default=1024)
    parser.add_argument("--run", default="run", help="the run's name: its dir under --work and its figures' file")
    # The chat preset's own unless given (trainer/config/schema.py).
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--drafter-layers", type=int)
    parser.add_argument("--train-seconds", type=float, default=None,
                        help="stop training after this long and walk its last checkpoint (a call has 10 minutes)")
    parser.add_argument("--eager", action="store_true", help="eager SDPA, as the chat runs before issue 60 trained")
    parser.add_argument("--detach", action="store_true",
                        help="start training in a session of its own, from a copy of the project in --work, and "
                             "return: the next call on the warm machine evaluates it (bench/gpu/eval_chat.sh)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for part in args.gguf_parts or []:
        shutil.copy(part, args.work / part.name)
    if args.stash:
        print("stashed", sorted(p.name for p in args.work.iterdir()))
        return

    from trainer.data import corpus
    from trainer.targets.gguf import convert

    figures: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each phase: a call cut short still brings back what it measured
        (args.out / f"chat_recipe-{args.run}.json").write_text(json.dumps(figures, indent=2))

    target = args.work / "target"
    if not target.exists():
        gguf = args.work / "model.gguf"
        with gguf.open("wb") as joined:
            for part in sorted(args.work.glob("part-*")):
                joined.write(part.read_bytes())
        started = time.perf_counter()
        figures["convert"] = convert(gguf, target) | {"seconds": round(time.perf_counter() - started, 1)}
        save()
    pool = corpus.instruction_pool(False, corpus.INSTRUCTION_KINDS)
    train_texts = corpus.instructions(False, min(args.train, len(pool)), 0, corpus.INSTRUCTION_KINDS)
    held_texts = corpus.instructions(True, args.held_out, seed=0)
    data = args.work / f"answers-{len(train_texts)}.jsonl"
    if not data.exists():  # answered by an earlier call on this machine: the same instructions, the same answers
        answered, decoding = answers(target, train_texts, args.answer_tokens, batch=args.answer_batch)
        figures["answers"] = {"rows": len(answered), "pool": len(pool), **decoding,
                              "empty": sum(not text.strip() for text in answered),
                              "with_def": sum("def " in text for text in answered), "example": answered[0][:400]}
        save()
        rows = "".join(json.dumps({"conversations": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n"
                       for q, a in zip(train_texts, answered))
        data.with_suffix(".part").write_text(rows)
        data.with_suffix(".part").rename(data)
        (args.out / "answers.jsonl.gz").write_bytes(gzip.compress(rows.encode()))
    held = args.work / "held-out.jsonl"
    held.write_text("".join(json.dumps({"conversations": [{"role": "user", "content": q}]}) + "\n" for q in held_texts))
    config = args.work / f"{args.run}.json"
    given = {"steps": args.steps, "batch_size": args.batch_size, "drafter": args.drafter_layers and
             {"num_layers": args.drafter_layers}}
    # The preset's own attention and compile: flex over packed rows, compiled (1.85x eager SDPA's tokens/s on an
    # H100, bench/gpu/chat_compiled.sh); EAGER=1 (--eager) trains as the runs before issue 60 did.
    how = {"attention": "sdpa", "compile": False} if args.eager else {}
    config.write_text(json.dumps({"preset": "chat", "dtype": "bfloat16", **how,
                                  "walk_prompts": args.held_out, "walk_new_tokens": 96,
                                  **{k: v for k, v in given.items() if v}}))
    figures["config"] = json.loads(config.read_text())
    run = args.work / args.run
    shutil.rmtree(run, ignore_errors=True)
    project = PROJECT
    if args.detach:  # the working tree is laid again by the next call: the run must not read it
        project = args.work / "project"
        shutil.rmtree(project, ignore_errors=True)
        shutil.copytree(PROJECT / "trainer", project / "trainer")
    env = dict(os.environ, PYTHONPATH=f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    started = time.perf_counter()
    log = (args.work / f"{args.run}.log").open("w")
    train = subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config), "--target",
                              str(target), "--data", str(data), "--out", str(run)], stdout=log, stderr=log, env=env,
                             cwd=args.work, start_new_session=args.detach)
    if args.detach:
        (args.work / f"{args.run}.pid").write_text(str(train.pid))
        figures["train"] = {"detached": train.pid}
        save()
        print(json.dumps(figures.get("answers", {})))
        return
    try:
        train.wait(timeout=args.train_seconds)
    except subprocess.TimeoutExpired:  # the last checkpoint (every 500 steps) is walked
        train.terminate()
        train.wait()
    log.close()
    figures["train"] = {"exit": train.returncode, "seconds": round(time.perf_counter() - started, 1),
                        "tail": (args.work / f"{args.run}.log").read_text()[-3000:]}
    save()
    if (run / "metrics.jsonl").exists():  # the teacher-forced evals on the way (a run cut short has no summary)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"eval": true' in line]
        figures["evals"] = [{k: row.get(k) for k in ("step", "acceptance_length", "baseline_copy_tau", "method")}
                            for row in rows]
    if (run / "summary.json").exists():
        figures["summary"] = json.loads((run / "summary.json").read_text())
    if (run / "checkpoint.pt").exists():
        started = time.perf_counter()
        walked = subprocess.run([sys.executable, "-m", "trainer", "eval", "--ckpt", str(run / "checkpoint.pt"),
                                 "--walk", "--prompts", str(held)], capture_output=True, text=True, env=env)
        figures["walk_seconds"] = round(time.perf_counter() - started, 1)
        figures["walk"] = json.loads(walked.stdout) if walked.returncode == 0 else {"error": walked.stderr[-2000:]}
    save()
    walk = figures.get("walk", {})
    print(json.dumps({k: walk.get(k) for k in ("walk_tau", "walk_repeat_tau", "walk_copy_tau", "walk_degenerate",
                                              "walk_counted", "walk_near_ties")}), figures.get("walk_seconds"))


if __name__ == "__main__":
    main()
