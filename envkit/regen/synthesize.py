"""`envkit data synthesize`: prompts the target writes itself, the way Magpie draws instructions from an aligned model.

The target's chat template is rendered up to where a user's message begins (trainer/data/chat_turns.py cuts it) and
sent raw to `/v1/completions`, sampled (temperature, top-p, a seed per attempt), cut where the user turn ends. What
comes back is data until it passes: not empty, finished (not cut by max_tokens), within a length range, not
degenerate (mostly one repeated word, line or character, or a loop that compresses to nothing), no template markup,
and unique by its normalised text; every rejection is counted by reason. With `turns` K > 1 each follow-up user
message is written given the conversation so far (the target answering in between, greedy), where the template
composes by concatenation. Rows are `conversations` of user turns (and the answers between them), each with an `id`,
the digest of its normalised text, which decides the held-out split: never chance.

It is regeneration's sibling, not a copy: attempt k is input line k of the same engine (job.py `Run`), answered by
the same client (openai_api.py) into the same ledger, errors file and checkpointed manifest (ledger.py), so a kill
is resumed with `--resume` and the rows written before it are kept byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from envkit import __version__
from envkit.errors import RegenError
from envkit.prompts.identity import is_held_out, prompt_id
from envkit.prompts.quality import MAX_CHARS, MIN_CHARS, prompt_rejection, template_markers
from envkit.regen import openai_api
from envkit.regen.job import Item, Outcome, Run
from envkit.regen.ledger import MANIFEST_FORMAT, Ledger, manifest_path
from envkit.regen.regenerate import choose_model, connect
from envkit.support.fsops import write_json_atomic
from envkit.support.trainer_helpers import atomic_write, read_json_file

SEED_STRIDE = 1_000_003  # attempt k of seed S samples with seed S * stride + k * TURN_SEEDS + turn
TURN_SEEDS = 64


@dataclass(frozen=True)
class SynthRequest:
    servers: tuple[str, ...]
    out: Path
    count: int  # unique prompts wanted
    template: dict  # the chat template's pieces (envkit/trainerproc/chat_turns.py)
    tokenizer: str  # where the template came from (the manifest says)
    model: str | None = None
    turns: int = 1  # user turns a row holds
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256  # a user message; one that needs more is unfinished, not kept
    answer_tokens: int = 512  # the target's answers between user turns (turns > 1)
    min_chars: int = MIN_CHARS
    max_chars: int = MAX_CHARS
    max_attempts: int | None = None  # default: 8 x count
    held_out: float = 0.05  # the share of prompts (by digest) in the held-out file
    concurrency: int = 8  # per server
    chat_template_kwargs: dict | None = None
    resume: bool = False
    retries: int = 5
    backoff_s: float = 0.5
    connect_timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    max_failures: str | None = None

    @property
    def attempts(self) -> int:
        return self.max_attempts or 8 * self.count


@dataclass
class SynthResult:
    out: str
    manifest: str
    train: str
    held_out: str
    model: str
    rows: int
    train_rows: int
    held_out_rows: int
    attempts: int
    rejected: dict
    failed: int
    seconds: float


def check_count(count: int) -> None:
    """Checked before anything is started (the template is cut in the training venv first)."""
    if count < 1:
        raise RegenError(f"--count {count}: give how many prompts to write (1 or more)")


def check_request(request: SynthRequest) -> None:
    check_count(request.count)
    if not math.isfinite(request.temperature) or request.temperature < 0:
        raise RegenError(f"--temperature {request.temperature} is not a finite number >= 0")
    if not (math.isfinite(request.top_p) and 0 < request.top_p <= 1):
        raise RegenError(f"--top-p {request.top_p}: give a number in (0, 1]")
    if not 0 <= request.held_out < 1:
        raise RegenError(f"--held-out {request.held_out}: give a share in [0, 1)")
    if not 0 < request.min_chars <= request.max_chars:
        raise RegenError(f"--min-chars {request.min_chars} and --max-chars {request.max_chars}: give 0 < min <= max")
    if request.attempts < request.count:
        raise RegenError(f"--max-attempts {request.attempts} is fewer than --count {request.count}")
    if request.turns > 1 and not request.template.get("composable"):
        raise RegenError(f"--turns {request.turns}: the chat template of {request.tokenizer} renders earlier turns "
                         f"differently from later ones, so follow-up turns cannot be written by appending; use --turns 1")


def rejection(text: str, finish: str | None, request: SynthRequest, markers: list[str]) -> str | None:
    return prompt_rejection(text, finish, request.min_chars, request.max_chars, markers)


# -- the work the engine does -------------------------------------------------------------------------------------
class Attempts:
    """The input of a synthesis: attempt k is line k (its offset k), so the ledger checkpoints and resumes it as it
    does a prompt file."""

    def __init__(self, total: int, sha256: str):
        self.rows = self.lines = total
        self.sha256 = sha256

    def rows_from(self, offset: int, line: int):
        for number in range(line + 1, self.rows + 1):
            yield number, b"", number

    def check_unchanged(self) -> None:
        pass


class Synthesis:
    """Synthesis's work for `Run`: sample, cut, filter in the workers; uniqueness in the writer (input order)."""

    def __init__(self, request: SynthRequest, seen: set[str], extra_by_server: dict[str, dict]):
        self.request, self.seen, self.extra_by_server = request, seen, extra_by_server
        self.markers = template_markers(request.template)

    def item(self, index: int, number: int, raw: bytes) -> Item:
        return Item(index, number, {}, None)

    def _ask(self, server, endpoint: str, payload: dict, outcome: Outcome, where: str) -> openai_api.Reply | None:
        """One request, its tokens and finish reason recorded; None when the server would not answer (the row is
        set aside with the reason and `where`)."""
        request = self.request
        try:
            reply = server.generate(endpoint, payload, max_tokens=payload["max_tokens"], retries=request.retries,
                                    backoff_s=request.backoff_s, timeout_s=request.request_timeout_s)
        except openai_api.RowFailed as exc:
            outcome.failure = f"{exc} ({where})"
            return None
        outcome.tokens.append(reply.tokens)
        outcome.finish.append(reply.finish_reason)
        return reply

    def answer(self, server, item: Item, model: str) -> Outcome:
        request, template = self.request, self.request.template
        outcome, conversation, prompt = Outcome(item.index, server=server.url), [], template["before_user"]
        for turn in range(request.turns):
            payload = {"model": model, "prompt": prompt, "max_tokens": request.max_tokens,
                       "temperature": request.temperature, "top_p": request.top_p, "stop": [template["user_stop"]],
                       "seed": (request.seed * SEED_STRIDE + item.number * TURN_SEEDS + turn) % 2 ** 31,
                       **self.extra_by_server.get(server.url, {})}
            reply = self._ask(server, "completions", payload, outcome, f"user turn {turn + 1}")
            if reply is None:
                return outcome
            text = reply.text.removesuffix(template["user_stop"]).strip()
            why = rejection(text, reply.finish_reason, request, self.markers)
            if why:
                outcome.rejected = why if turn == 0 else f"{why} (turn {turn + 1})"
                return outcome
            conversation.append({"role": "user", "content": text})
            if turn + 1 == request.turns:
                break
            answer = self._answer_turn(server, conversation, model, outcome)
            if answer is None:
                return outcome
            conversation.append({"role": "assistant", "content": answer})
            prompt += text + template["user_to_assistant"] + answer + template["assistant_to_user"]
        row_id = prompt_id([turn["content"] for turn in conversation if turn["role"] == "user"])
        outcome.line = (json.dumps({"id": row_id, "conversations": conversation}, ensure_ascii=False) + "\n").encode()
        outcome.rejected = None
        return outcome

    def _answer_turn(self, server, conversation: list[dict], model: str, outcome: Outcome) -> str | None:
        """The target's own answer between user turns (greedy); `data regenerate` answers every turn again later."""
        request = self.request
        payload = {"model": model, "messages": conversation, "max_tokens": request.answer_tokens, "temperature": 0.0}
        if request.chat_template_kwargs:
            payload["chat_template_kwargs"] = request.chat_template_kwargs
        reply = self._ask(server, "chat/completions", payload, outcome,
                          f"the answer to user turn {len(conversation) // 2 + 1}")
        if reply is None:
            return None
        if not reply.text.strip():
            outcome.rejected = f"empty answer (turn {len(conversation) + 1})"
            return None
        return reply.text

    name = "synthesize"

    def enough(self, settled) -> bool:
        return settled.rows >= self.request.count

    def more_in_flight(self, settled, in_flight: int) -> bool:
        """The prompts still wanted and a server's concurrency in flight: few are drawn past the count."""
        return in_flight < self.request.count - settled.rows + self.request.concurrency

    def settle(self, outcome: Outcome, settled) -> Outcome:
        if outcome.line is None or outcome.rejected is not None:
            return outcome
        row_id = json.loads(outcome.line)["id"]
        if settled.rows >= self.request.count:
            outcome.rejected = "surplus"  # in flight when the count was reached
        elif row_id in self.seen:
            outcome.rejected = "duplicate"
        else:
            self.seen.add(row_id)
        return outcome

    def final_status(self, settled) -> str:
        return "complete" if settled.rows >= self.request.count else "exhausted"


# -- the entry ------------------------------------------------------------------------------------------------------
def sampling_switch(engines: dict[str, dict], temperature: float) -> dict[str, dict]:
    """What each server needs to sample at all. vLLM and SGLang sample whenever the temperature is above 0;
    `transformers serve` (it reports no engine) samples only where the model's generation config says do_sample,
    unless the request carries a generation config that does."""
    if temperature <= 0:
        return {}
    return {url: {"generation_config": json.dumps({"do_sample": True})} for url, engine in engines.items()
            if engine.get("engine") is None}


def _recipe(request: SynthRequest) -> dict:
    """What decides the prompts written: a resume must ask for the same, or it is refused."""
    return {"template_sha256": request.template["template_sha256"], "before_user": request.template["before_user"],
            "user_stop": request.template["user_stop"], "turns": request.turns, "seed": request.seed,
            "temperature": request.temperature, "top_p": request.top_p, "max_tokens": request.max_tokens,
            "answer_tokens": request.answer_tokens, "min_chars": request.min_chars, "max_chars": request.max_chars,
            "chat_template_kwargs": request.chat_template_kwargs}


def _seen_ids(out: Path, settled_bytes: int) -> set[str]:
    """The ids of the rows kept before a resume (the bytes the manifest vouches for)."""
    seen = set()
    with out.open("rb") as handle:
        for line in handle.read(settled_bytes).splitlines():
            seen.add(json.loads(line)["id"])
    return seen


def split_paths(out: Path) -> tuple[Path, Path]:
    stem = out.name.removesuffix(".jsonl")
    return out.with_name(f"{stem}.train.jsonl"), out.with_name(f"{stem}.held-out.jsonl")


def _write_split(out: Path, share: float) -> dict:
    """OUT split by each row's digest into its train and held-out files (a function of OUT: rewritten alike)."""
    train_path, held_path = split_paths(out)
    train, held = [], []
    with out.open("rb") as handle:
        for line in handle:
            (held if is_held_out(json.loads(line)["id"], share) else train).append(line)
    atomic_write(train_path, b"".join(train))
    atomic_write(held_path, b"".join(held))
    return {"train": {"file": train_path.name, "rows": len(train)}, "held_out": {"file": held_path.name,
                                                                                "rows": len(held), "share": share}}


def synthesize(request: SynthRequest) -> SynthResult:
    check_request(request)
    servers = connect(request)
    listed = {server.url: server.models(request.connect_timeout_s) for server in servers}
    model = choose_model(listed, request.model)
    recipe = _recipe(request)
    attempts = Attempts(request.attempts, hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest())
    manifest = {"format": MANIFEST_FORMAT, "kind": "synthesized", "prompts": f"synthesized from {request.tokenizer}",
                "prompts_sha256": attempts.sha256, "prompts_rows": attempts.rows, "prompts_lines": attempts.lines,
                "model": model, "settings": recipe, "count": request.count, "tokenizer": request.tokenizer,
                "servers": [server.url for server in servers],
                "engines": {server.url: server.engine() for server in servers}, "envkit": __version__}
    ledger = Ledger(request.out, manifest, request.resume)
    if ledger.already_complete and ledger.settled.rows < request.count:
        ledger.already_complete = False  # resumed with a larger --count: write on
    try:
        seen = _seen_ids(request.out, ledger.settled.out_bytes) if ledger.settled.out_bytes else set()
        work = Synthesis(request, seen, sampling_switch(manifest["engines"], request.temperature))
        result = Run(request, servers, attempts, ledger, model, work=work).go()
        record = read_json_file(manifest_path(request.out), limit=16 << 20)
        if record.get("status") != "complete":
            rejected = ", ".join(f"{count} {why}" for why, count in sorted(record["observed"]["rejected"].items()))
            duplicates = record["observed"]["rejected"].get("duplicate", 0)
            hint = (" (most were duplicates: does the server sample? `transformers serve --continuous-batching` "
                    "samples only where the model's generation config does)" if duplicates * 2 > request.attempts else "")
            raise RegenError(f"{result.rows:,} unique prompts of the {request.count:,} asked in {request.attempts:,} "
                             f"attempts (rejected: {rejected or 'none'}; set aside: {result.failed:,}){hint}; raise "
                             f"--max-attempts and --resume, or write longer (--max-tokens) or hotter (--temperature)")
        split = _write_split(request.out, request.held_out)
        write_json_atomic(manifest_path(request.out), record | {"split": split}, mode=0o644)
    finally:
        ledger.close()
    train_path, held_path = split_paths(request.out)
    return SynthResult(str(request.out), str(manifest_path(request.out)), str(train_path), str(held_path), model,
                       result.rows, split["train"]["rows"], split["held_out"]["rows"], record["settled"]["input_line"],
                       dict(record["observed"]["rejected"]), result.failed, result.seconds)
