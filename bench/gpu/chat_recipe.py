"""The chat recipe on the device: SmolLM2-135M-Instruct answering instructions, its drafter trained on those
answers, walked on held-out instructions through the chat template.

    python bench/gpu/chat_recipe.py --gguf-parts .gguf/part-* --work /tmp/chat --out $OUT [--train 8000]
        [--synthesized N] [--steps N | --epochs E] [--batch-size B] [--drafter-layers L] [--run NAME]

The GGUF travels in parts (the device carries 64 MiB a call): a call with --stash only copies the parts it was given
into --work; the next call joins them. The training instructions are drawn evenly from every kind
`envkit data instructions --kind` writes (trainer/data/corpus.py), the held-out ones are the walk's kind,
"Write a Python function", from held-out files. With --synthesized N, N prompts the target writes itself
(bench/gpu/synthesized_prompts.py, Magpie-style) join the instructions, and a second held-out file holds synthesized
prompts the digest held out, so each kind of traffic is walked on its own. The answers are the target's greedy
answers, generated here by the trainer's batched decoder (no serving engine on the device); on CPU the same answers
come through `envkit serve` and `envkit data regenerate` (tests/envkit/test_chat_target.py). They are kept in --work
(and a copy in OUT), so a later call on the same machine trains another run (--run) on them without answering again.
Figures go to OUT/chat_recipe-RUN.json.
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


def load(target: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke run of the script itself
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).to(device).eval()
    return model, AutoTokenizer.from_pretrained(target)


def answers(model, tokenizer, instructions: list[str], max_new_tokens: int, batch: int) -> tuple[list[str], dict]:
    """The target's greedy answers through the trainer's batched decoder (trainer/data/greedy_decode.py, the walk's),
    batches of like lengths; figures: seconds and generated tokens per second."""
    import torch

    from trainer.data.greedy_decode import padded_greedy

    device = next(model.parameters()).device.type
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


def write_prompts_file(path: Path, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"conversations": [{"role": "user", "content": q}]}) + "\n" for q in texts))


def synthesize(model, tokenizer, target: Path, args, figures: dict, save) -> list[str]:
    """The synthesized training prompts; the held-out ones (by digest) go to held-out-synthesized.jsonl."""
    from synthesized_prompts import held_out_split, write_prompts

    from trainer.data.chat_turns import chat_turns

    wanted = round(args.synthesized / 0.98) + 1  # the digest holds out 2%
    texts, figures["synthesis"] = write_prompts(
        model, tokenizer, chat_turns(str(target)), wanted, seed=args.seed, batch=args.synth_batch,
        max_tokens=args.synth_tokens, temperature=1.0, top_p=args.top_p, max_attempts=4 * wanted,
        max_seconds=args.synth_seconds)
    train, held = held_out_split(texts, 0.02)
    figures["synthesis"] |= {"train": len(train), "held_out": len(held), "examples": texts[:12]}
    save()
    write_prompts_file(args.work / "held-out-synthesized.jsonl", held[:args.held_out])
    return train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf-parts", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/chat"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--stash", action="store_true")
    parser.add_argument("--train", type=int, default=8000, help="training instructions (at most all there are)")
    parser.add_argument("--held-out", type=int, default=64, help="prompts walked a held-out file")
    parser.add_argument("--answers", type=Path, help="train on these answers (JSONL, or .gz) instead of answering")
    parser.add_argument("--synthesized", type=int, default=0, help="prompts the target writes itself, kept")
    parser.add_argument("--held-out-only", action="store_true",
                        help="only write the held-out files (with --synthesized N: of N written prompts) and stop")
    parser.add_argument("--synth-batch", type=int, default=2048)
    parser.add_argument("--synth-tokens", type=int, default=128, help="a written prompt's most tokens")
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synth-seconds", type=float, default=None, help="stop writing prompts after this long")
    parser.add_argument("--answer-tokens", type=int, default=256)
    parser.add_argument("--answer-batch", type=int, default=1024)
    parser.add_argument("--run", default="run", help="the run's name: its dir under --work and its figures' file")
    # The chat preset's own unless given (trainer/config/schema.py).
    parser.add_argument("--steps", type=int)
    parser.add_argument("--epochs", type=int, help="passes over the answers (the steps follow from the data)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--drafter-layers", type=int)
    parser.add_argument("--block-size", type=int, help="the drafter's block (the preset's 8; the anchors' 16)")
    parser.add_argument("--gamma", type=float, help="the loss weighting's decay over block positions")
    parser.add_argument("--anchors", type=int, help="blocks drawn per row a step (the preset's 32)")
    parser.add_argument("--lr", type=float, help="the peak learning rate (the preset's 1e-3)")
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
    instruction_texts = corpus.instructions(False, min(args.train, len(pool)), 0, corpus.INSTRUCTION_KINDS)
    held_texts = corpus.instructions(True, args.held_out, seed=0)
    held = args.work / "held-out.jsonl"
    write_prompts_file(held, held_texts)
    if args.held_out_only:
        # The held-out synthesized prompts of given answers: the same seed and batch write the same prompts, and a
        # prompt the digest holds out was never answered for training, whichever run wrote it.
        model, tokenizer = load(target)
        synthesize(model, tokenizer, target, args, figures, save)
        return
    data = args.work / f"answers-{len(instruction_texts)}-{args.synthesized}.jsonl"
    if args.answers:  # an earlier call's answers (the 8,000-answer drafter trained again beside a new one)
        data = args.work / f"given-{args.answers.name.removesuffix('.gz')}"
        opened = gzip.open if args.answers.suffix == ".gz" else open
        with opened(args.answers, "rb") as given:
            data.write_bytes(given.read())
    if not data.exists():  # answered by an earlier call on this machine: the same prompts, the same answers
        model, tokenizer = load(target)
        synthesized = synthesize(model, tokenizer, target, args, figures, save) if args.synthesized else []
        train_texts = synthesized + instruction_texts
        answered, decoding = answers(model, tokenizer, train_texts, args.answer_tokens, batch=args.answer_batch)
        figures["answers"] = {"rows": len(answered), "synthesized": len(synthesized),
                              "instructions": len(instruction_texts), "pool": len(pool), **decoding,
                              "empty": sum(not text.strip() for text in answered),
                              "with_def": sum("def " in text for text in answered), "example": answered[-1][:400]}
        save()
        rows = "".join(json.dumps({"conversations": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n"
                       for q, a in zip(train_texts, answered) if a.strip())
        data.with_suffix(".part").write_text(rows)
        data.with_suffix(".part").rename(data)
        (args.out / "answers.jsonl.gz").write_bytes(gzip.compress(rows.encode()))
        del model
    config = args.work / f"{args.run}.json"
    drafter = {"num_layers": args.drafter_layers, "block_size": args.block_size, "gamma": args.gamma}
    given = {"steps": args.steps, "epochs": args.epochs, "batch_size": args.batch_size, "num_anchors": args.anchors,
             "lr": args.lr,
             "drafter": {k: v for k, v in drafter.items() if v}}
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
        project = args.work / f"project-{args.run}"  # another run may still be reading its own copy
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
