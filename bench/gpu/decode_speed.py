"""Issue 60 item 3: generated tokens/s of batched greedy decoding for SmolLM2-135M's shapes on one GPU, by way of
decoding: the trainer's decoder (trainer/data/greedy_decode.py) over its preallocated cache with a CUDA graph per
width (`static`, trainer/data/static_decode.py) or through transformers' forward with a growing cache (`growing`,
what it did before), and transformers' `generate` with a static cache, compiled (`generate_static_compiled`).
Random weights from the carried config (a step's cost does not depend on the values; no stop token is ever hit, so
every row decodes --new-tokens). `sampled` is the static way drawing under temperature 1, top-p 0.95 (synthesis).

    python3 bench/gpu/decode_speed.py --target-config .chatcfg --prompts 4096 --new-tokens 256 --batch 1024 2048 \
        --ways static sampled growing
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def timed(call) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target-config", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, nargs="+", default=[1024])
    parser.add_argument("--ways", nargs="+", default=["static", "growing"])
    parser.add_argument("--growing-prompts", type=int, default=1024, help="the slow way decodes only these")
    args = parser.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trainer.data.corpus import INSTRUCTION_KINDS, instructions
    from trainer.data import greedy_decode
    from trainer.data.static_decode import Sampling

    supports = greedy_decode.supports
    tokenizer = AutoTokenizer.from_pretrained(args.target_config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.target_config), dtype=torch.bfloat16)
    model = model.cuda().eval()
    texts = instructions(False, args.prompts, 0, INSTRUCTION_KINDS)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"] for t in texts]
    prompts.sort(key=len)
    print(json.dumps({"prompts": len(prompts), "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts)}))
    for batch in args.batch:
        for way in args.ways:
            chosen = prompts[:args.growing_prompts] if way == "growing" else prompts
            try:
                if way == "generate_static_compiled":
                    run = static_generate(model, chosen, args.new_tokens, batch)
                else:
                    def run(way=way, chosen=chosen):
                        greedy_decode.supports = (lambda target: False) if way == "growing" else supports
                        sampling = Sampling(1.0, 0.95) if way == "sampled" else None
                        greedy_decode.padded_decode(model, chosen, args.new_tokens, batch, by_length=True,
                                                    sampling=sampling)
                first = timed(run)  # compiles or captures graphs; the growing way is timed once
                seconds = timed(run) if way != "growing" else first
                tokens = len(chosen) * args.new_tokens
                print(json.dumps({"way": way, "batch": batch, "first_s": round(first, 1), "seconds": round(seconds, 2),
                                  "tokens_per_s": round(tokens / seconds)}), flush=True)
            except Exception as exc:  # a way that does not run here is reported, not fatal
                print(json.dumps({"way": way, "batch": batch, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}),
                      flush=True)


def static_generate(model, prompts: list[list[int]], new_tokens: int, batch: int):
    """transformers' generate with a static cache (compiled forward, CUDA graphs): left-padded batches of like
    lengths, every batch padded to one width so the compiled graphs are reused."""
    width = max(map(len, prompts))
    batches = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device="cuda")
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device="cuda")
        batches.append((ids, mask))

    def run():
        for ids, mask in batches:
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, cache_implementation="static", pad_token_id=0)

    return run


if __name__ == "__main__":
    main()
