"""The chat recipe on the device: SmolLM2-135M-Instruct answering instructions, its drafter trained on those
answers, walked on held-out instructions through the chat template.

    python bench/gpu/chat_recipe.py --gguf-parts .gguf/part-* --work /tmp/chat --out $OUT [--train 1024] [--steps 1000]

The GGUF travels in parts (the device carries 64 MiB a call): a call with --stash only copies the parts it was given
into --work; the next call joins them. The answers are the target's greedy answers, generated here in batches with
transformers (no serving engine on the device); on CPU the same answers come through `envkit serve` and
`envkit data regenerate` (tests/envkit/test_chat_target.py). Figures go to OUT/chat_recipe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))


def answers(target: Path, instructions: list[str], max_new_tokens: int, batch: int) -> tuple[list[str], float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # SmolLM2's GGUF names none; <|im_end|> (id 2) ends every answer anyway
        tokenizer.pad_token = "<|im_end|>"
    pad = tokenizer.pad_token_id
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke run of the script itself
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).to(device).eval()
    started = time.perf_counter()
    out = []
    for start in range(0, len(instructions), batch):
        chats = [[{"role": "user", "content": text}] for text in instructions[start:start + batch]]
        rendered = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
        enc = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            generated = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
        for row in generated[:, enc["input_ids"].shape[1]:]:
            out.append(tokenizer.decode(row, skip_special_tokens=True))
    return out, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf-parts", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/chat"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--stash", action="store_true")
    parser.add_argument("--train", type=int, default=1024)
    parser.add_argument("--held-out", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--answer-tokens", type=int, default=256)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for part in args.gguf_parts or []:
        shutil.copy(part, args.work / part.name)
    if args.stash:
        print("stashed", sorted(p.name for p in args.work.iterdir()))
        return

    from trainer.data import corpus
    from trainer.targets.gguf import convert

    figures: dict = {}
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each phase: a call cut short still brings back what it measured
        (args.out / "chat_recipe.json").write_text(json.dumps(figures, indent=2))

    target = args.work / "target"
    if not target.exists():
        gguf = args.work / "model.gguf"
        with gguf.open("wb") as joined:
            for part in sorted(args.work.glob("part-*")):
                joined.write(part.read_bytes())
        started = time.perf_counter()
        figures["convert"] = convert(gguf, target) | {"seconds": round(time.perf_counter() - started, 1)}
        save()
    train_texts = corpus.instructions(False, args.train, seed=0)
    held_texts = corpus.instructions(True, args.held_out, seed=0)
    answered, seconds = answers(target, train_texts, args.answer_tokens, batch=128)
    figures["answers"] = {"rows": len(answered), "seconds": round(seconds, 1),
                          "empty": sum(not text.strip() for text in answered),
                          "with_def": sum("def " in text for text in answered), "example": answered[0][:400]}
    save()
    data = args.work / "answers.jsonl"
    data.write_text("".join(json.dumps({"conversations": [{"role": "user", "content": q},
                                                          {"role": "assistant", "content": a}]}) + "\n"
                            for q, a in zip(train_texts, answered)))
    held = args.work / "held-out.jsonl"
    held.write_text("".join(json.dumps({"conversations": [{"role": "user", "content": q}]}) + "\n" for q in held_texts))
    config = args.work / "chat_gpu.json"
    config.write_text(json.dumps({"preset": "chat", "steps": args.steps, "dtype": "bfloat16", "attention": "sdpa",
                                  "compile": False, "walk_prompts": args.held_out, "walk_new_tokens": 96,
                                  "data": {"buckets": [256, 512]}}))
    run = args.work / "run"
    shutil.rmtree(run, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=f"{PROJECT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    started = time.perf_counter()
    train = subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(config), "--target", str(target),
                            "--data", str(data), "--out", str(run)], capture_output=True, text=True, env=env)
    figures["train"] = {"exit": train.returncode, "seconds": round(time.perf_counter() - started, 1),
                        "tail": train.stdout[-1500:] + train.stderr[-1500:]}
    save()
    if train.returncode == 0:
        figures["summary"] = json.loads((run / "summary.json").read_text())
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
