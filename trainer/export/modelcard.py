"""The README.md of an export: what the drafter is, what it was trained against and on, how well it drafts,
and how to serve it. Built from the checkpoint, the run's summary.json and the target's build record,
all read as data (numbers are checked to be numbers; nothing from them is run)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from trainer.common.files import read_json_record
from trainer.config.schema import TrainConfig

SUMMARY_LIMIT = 1 << 20


def read_summary(run_dir: Path) -> dict:
    """The run's summary.json when it is a small regular file holding an object; else {} (not finished)."""
    return read_json_record(run_dir / "summary.json", limit=SUMMARY_LIMIT) or {}


def _number(values: dict, key: str, spec: str = ".2f") -> str:
    value = values.get(key)
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def serve_commands(target: str, out: str, block_size: int, *, placeholders: bool = False) -> dict[str, str]:
    """How SGLang and vLLM serve a DFlash drafter (their documented flags); the drafter drafts block - 1 tokens.
    `target` and `out` are raw paths, each quoted once for the shell (inside the JSON too: the JSON is quoted
    as a whole); placeholders (TARGET, DIR) are left bare for the card to explain."""
    quote = (lambda text: text) if placeholders else shlex.quote  # noqa: E731
    spec = json.dumps({"method": "dflash", "model": out, "num_speculative_tokens": block_size - 1})
    return {"sglang": f"python -m sglang.launch_server --model-path {quote(target)} --speculative-algorithm DFLASH "
                      f"--speculative-draft-model-path {quote(out)}",
            "vllm": f"vllm serve {quote(target)} --speculative-config {shlex.quote(spec)}"}


def _code(text) -> str:
    """A string from a checkpoint or a build record as inline code in the card: one line, no control characters,
    no backtick to close the span early; markdown and HTML inside a code span are shown, never rendered."""
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text)[:300])
    return "`" + text.replace("`", "'") + "`"


def _target_lines(cfg: TrainConfig, target_record: dict | None) -> list[str]:
    t = cfg.target
    shape = (f"Qwen3, {t.num_layers} layers, hidden {t.hidden_size}, {t.num_heads} heads ({t.num_kv_heads} kv), "
             f"vocab {t.vocab_size}")
    if target_record and isinstance(target_record.get("source"), dict):  # a pretrained target, fetched and converted
        origin = target_record["source"]
        return [f"- Target: {_code(cfg.target.recipe)}: {_code(origin.get('description', '?'))}, from "
                f"{_code(origin.get('package', '?'))} {_code(origin.get('version', '?'))} (sha256 "
                f"{_code(str(origin.get('sha256', '?'))[:16])}...), converted by `envkit target fetch`: vocab "
                f"{t.vocab_size}, {t.num_layers} layers, hidden {t.hidden_size}. Its weights and tokenizer are in "
                f"`target/`."]
    if target_record:
        corpus = target_record.get("corpus") if isinstance(target_record.get("corpus"), dict) else {}
        return [f"- Target: {_code(cfg.target.recipe)}, trained by envkit (`python -m trainer make-target`): {shape}, "
                f"{_number(target_record, 'parameters', ',')} parameters, on the Python "
                f"{_code(corpus.get('python', '?'))} standard library sources "
                f"({_number(corpus, 'train_files', 'd')} files, {_number(corpus, 'train_tokens', ',')} tokens; "
                f"{_number(corpus, 'held_out_files', 'd')} files held out), {_number(target_record, 'steps', 'd')} "
                f"steps; held-out loss {_number(target_record, 'held_out_loss', '.3f')}. Its weights and "
                f"tokenizer are in `target/`."]
    if cfg.target.path:
        return [f"- Target: the model at {_code(cfg.target.path)} ({shape})."]
    return [f"- Target: a random-weight {shape} (seed {t.seed}), exactly as trained against, in `target/`."]


def _data_line(cfg: TrainConfig) -> str:
    data = cfg.data
    if data.path:
        return f"- Data: {_code(data.path)}" + (", packed" if data.packing else "") + "."
    what = {"corpus": "prompts cut from the training files of the target's corpus, continued by the target itself",
            "generate": "random prompts continued by the target itself",
            "random": "uniform random tokens (a throughput workload; nothing to learn)",
            "chat_lengths": "uniform random tokens in a chat-like length mix (a throughput workload)"}[data.source]
    return f"- Data: {data.num_sequences} sequences, {what}; buckets {data.buckets}" + (
        ", packed." if data.packing else ".")


def render(cfg: TrainConfig, step: int, layer_ids: list[int], mask_token_id: int, summary: dict,
           target_record: dict | None, dtype: str) -> str:
    d = cfg.drafter
    walk = (f"{_number(summary, 'walk_tau')} tokens per target forward (repeat-anchor rule "
            f"{_number(summary, 'walk_repeat_tau')}, copy rule {_number(summary, 'walk_copy_tau')}) over "
            f"{_number(summary, 'walk_prompts', 'd')} held-out prompts x {_number(summary, 'walk_new_tokens', 'd')} "
            f"new tokens, greedy, each walk checked lossless against the target's own decoding"
            if summary else "not measured (the run had not finished when this was exported)")
    lines = [
        "# DFlash drafter trained by envkit", "",
        f"A {d.num_layers}-layer DFlash block drafter (block size {d.block_size}: the anchor and "
        f"{d.block_size - 1} drafted tokens), reading target layers {layer_ids}; mask token id {mask_token_id}; "
        f"weights in {dtype}.", "",
        "## What it was trained against and on", "",
        *_target_lines(cfg, target_record),
        _data_line(cfg),
        f"- Training: preset {_code(cfg.preset)}, {step} steps of batch {cfg.batch_size} x {cfg.num_anchors} anchors, "
        f"lr {cfg.lr}, loss weight of slot k exp(-(k-1)/{d.gamma})" +
        (", the target's context features zeroed (the ablation run)" if d.context == "zeros" else "") + ".",
        f"- Loss {_number(summary, 'loss_start', '.3f')} -> {_number(summary, 'loss_end', '.3f')}; teacher-forced "
        f"acceptance {_number(summary, 'tau_start')} -> {_number(summary, 'tau_end')}.", "",
        "## How well it drafts", "",
        f"Acceptance length by a speculative decoding walk: {walk}.", "",
        "## Serve it", "",
        "```",
        *serve_commands("TARGET", "DIR", d.block_size, placeholders=True).values(),
        "```", "",
        "DIR is this directory; TARGET is `DIR/target` when it exists, else the target named above. Files: "
        "`config.json` (a Qwen3 config with `dflash_config`), `model.safetensors` (no embedding or LM head: the "
        "target's are used), `envkit-export.json` (what was exported from where, with every file's sha256).",
    ]
    return "\n".join(lines) + "\n"
