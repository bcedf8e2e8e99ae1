"""Prompts the target writes itself, on the device (issue 60): what `envkit data synthesize` asks a server for
(the chat template rendered up to where a user's message begins, sampled, cut where the user turn ends), drawn here
by the trainer's batched decoder (trainer/data/greedy_decode.py, sampling) because the device has no serving
engine. The same keep rules (envkit/prompts/quality.py) and the same identity (envkit/prompts/identity.py): unique
by normalised text, held out by digest, never by chance; every rejection counted by reason."""

from __future__ import annotations

import sys
import time
from collections import Counter

from envkit.prompts.identity import is_held_out, normalised, prompt_id
from envkit.prompts.quality import MAX_CHARS, MIN_CHARS, prompt_rejection, template_markers


def write_prompts(model, tokenizer, template: dict, count: int, *, seed: int, batch: int, max_tokens: int,
                  temperature: float, top_p: float, max_attempts: int,
                  max_seconds: float | None = None) -> tuple[list[str], dict]:
    """Up to `count` unique kept prompts (fewer when `max_attempts` or `max_seconds` runs out) and the figures of
    writing them."""
    import torch

    from trainer.data.greedy_decode import padded_decode
    from trainer.data.static_decode import Sampling

    prefix = tokenizer(template["before_user"], add_special_tokens=False)["input_ids"]
    stop = tokenizer.convert_tokens_to_ids(template["user_stop"])
    stops = tuple({stop, tokenizer.eos_token_id} - {None})
    markers = template_markers(template)
    torch.manual_seed(seed)
    kept: dict[str, str] = {}
    rejected: Counter = Counter()
    attempts, tokens, started = 0, 0, time.perf_counter()
    while len(kept) < count and attempts < max_attempts and time.perf_counter() - started < (max_seconds or 1e18):
        rows = min(batch, max_attempts - attempts)
        # One more token than a kept prompt may have: a row that reaches it was cut, not finished.
        written = padded_decode(model, [prefix] * rows, max_tokens + 1, rows, stop_ids=stops,
                                sampling=Sampling(temperature, top_p))
        attempts += rows
        for row in written:
            tokens += len(row)
            text = tokenizer.decode(row, skip_special_tokens=True).strip()
            reason = prompt_rejection(text, "length" if len(row) > max_tokens else "stop", MIN_CHARS, MAX_CHARS,
                                      markers)
            key = normalised(text)
            if reason is None and key in kept:
                reason = "duplicate"
            if reason:
                rejected[reason] += 1
            elif len(kept) < count:
                kept[key] = text
        rate = tokens / (time.perf_counter() - started)
        print(f"synthesized {len(kept)} of {count} in {attempts} attempts, {rate:,.0f} tokens/s", file=sys.stderr,
              flush=True)
    seconds = time.perf_counter() - started
    figures = {"kept": len(kept), "attempts": attempts, "rejected": dict(rejected), "seconds": round(seconds, 1),
               "generated_tokens": tokens, "tokens_per_s": round(tokens / seconds), "seed": seed,
               "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens,
               "template_sha256": template["template_sha256"], "before_user": template["before_user"]}
    return list(kept.values()), figures


def held_out_split(texts: list[str], share: float) -> tuple[list[str], list[str]]:
    """(train, held out), the held-out ones decided by each prompt's digest (envkit/prompts/identity.py)."""
    held = [text for text in texts if is_held_out(prompt_id([text]), share)]
    chosen = set(held)
    return [text for text in texts if text not in chosen], held
