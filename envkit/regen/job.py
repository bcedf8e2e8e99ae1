"""The engine of `envkit data regenerate` and `data synthesize`: rows answered by the target through serving engines,
written in input order. What a row is and how it is answered is the work's (`Regeneration` below; synthesize.py's
`Synthesis`); a server dropping a row's request while it answers others sets the row aside, not the server.

Each server has its own workers (`concurrency` each) that take the next row when they have room, so a slow server
answers fewer rows and a dead one none (the run says which died, and its rows go to the others). One writer keeps
the input's order: OUT holds the answered rows, OUT.errors.jsonl the rows a server refused or could not answer
(the run goes on; `--max-failures` bounds how many). Memory holds a window of rows in flight, whatever the file's
size. The ledger (ledger.py) checkpoints both files and the manifest, so a kill at any point resumes to the bytes of
an uninterrupted run; the manifest vouches only for what was observed: the prompt bytes answered (hashed as they
were read), every server's engine, the lengths and finish reasons the replies showed.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from envkit.errors import RegenError
from envkit.regen import openai_api
from envkit.regen.ledger import Ledger, errors_path, manifest_path
from envkit.regen.request import RegenRequest, RegenResult, failure_bound
from envkit.regen.row_requests import BadRow, Plan, chat_history, plan_for, training_row
from envkit.support.text import printable
from envkit.support.trainer_helpers import loads_exchanged_json

PROGRESS_EVERY_S = 2.0
QUIET_PROGRESS_S = 30.0  # nothing settled: say so less often (a long answer is not news)


@dataclass
class Outcome:
    """A row's end: its training line, or why it was set aside."""
    index: int
    line: bytes | None = None
    failure: str | None = None
    rejected: str | None = None  # answered, but not kept (synthesis: empty, duplicate, degenerate, ...)
    server: str = ""
    tokens: list = field(default_factory=list)  # per request: generated tokens as the server counted (or None)
    finish: list = field(default_factory=list)


@dataclass
class Item:
    index: int
    number: int  # input line
    row: dict
    plan: Plan


class Run:
    """Workers per server, one writer in input order (this thread), checkpoints, progress.

    What a row is and how a server answers it is the `work`'s (`Regeneration` here: a prompt file's rows answered;
    synthesize.py's `Synthesis`: prompts the target writes); the engine, the ledger and the client are shared."""

    def __init__(self, request, servers: list[openai_api.Server], prompts, ledger: Ledger, model: str,
                 only_lines: set[int] | None = None, on_settle=None, work=None):
        self.request, self.servers, self.prompts, self.ledger, self.model = request, servers, prompts, ledger, model
        self.only_lines, self.on_settle = only_lines, on_settle  # --retry-failed: these lines, settled through it
        self.job = work or Regeneration(request)
        self.work: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.window = max(64, 4 * request.concurrency * len(servers))
        self.dead: dict[str, str] = {}
        self.max_failures = failure_bound(request.max_failures, prompts.rows)

    # -- workers ---------------------------------------------------------------------------------------------
    def _worker(self, server: openai_api.Server) -> None:
        while True:
            item = self.work.get()
            if item is None or server.url in self.dead:
                if item is not None:
                    self.work.put(item)  # another server's now
                return
            try:
                outcome = self.job.answer(server, item, self.model)
            except openai_api.ServerError as exc:
                if server.alive():  # it answers, but not this row's request: the row is set aside, not the server
                    self.results.put(("row", Outcome(item.index, failure=f"{exc}, while it answers other requests: "
                                                     f"the row, not the server", server=server.url)))
                    continue
                self.work.put(item)
                self.results.put(("dead", server.url, str(exc)))
                return
            except Exception as exc:  # a bug must stop the run with its message, never hang it
                self.results.put(("crash", server.url, f"{type(exc).__name__}: {exc}"))
                return
            self.results.put(("row", outcome))

    # -- the writer ------------------------------------------------------------------------------------------
    def go(self) -> RegenResult:
        ledger, settled = self.ledger, self.ledger.settled
        started, resumed_from = time.monotonic(), settled.input_line
        rows_before, failed_before = settled.rows, settled.failed
        tokens_before = settled.observed["generated_tokens"]
        progress = Progress(self.job.name, len(self.only_lines) if self.only_lines is not None else self.prompts.rows,
                            0 if self.only_lines is not None else rows_before + failed_before)
        if ledger.already_complete:
            return self._result(started, resumed_from, rows_before, failed_before, tokens_before)
        ledger.checkpoint(force=True)
        threads = [threading.Thread(target=self._worker, args=(server,), daemon=True, name=f"regen-{i}")
                   for i, server in enumerate(self.servers) for _ in range(self.request.concurrency)]
        for thread in threads:
            thread.start()
        reader = self.prompts.rows_from(settled.input_offset, settled.input_line)
        waiting: dict[int, tuple[Item, int]] = {}  # index -> (item, input offset after it)
        done: dict[int, Outcome] = {}
        next_index = to_settle = 0
        exhausted, bad_row = False, None  # a bad row stops the run once the rows before it are settled
        try:
            while True:
                while not exhausted and bad_row is None and next_index - to_settle < self.window:
                    if self.job.enough(settled):
                        exhausted = True
                        break
                    if not self.job.more_in_flight(settled, next_index - to_settle):
                        break
                    entry = next(reader, None)
                    if entry is None:
                        exhausted = True
                        break
                    number, raw, end_offset = entry
                    if self.only_lines is not None and number not in self.only_lines:
                        ledger.advance(end_offset, number)
                        continue
                    try:
                        item = self.job.item(next_index, number, raw)
                    except RegenError as exc:
                        bad_row = exc
                        break
                    waiting[next_index] = (item, end_offset)
                    self.work.put(item)
                    next_index += 1
                if (exhausted or bad_row) and to_settle == next_index:
                    if bad_row:
                        raise bad_row
                    break
                self._take(done)
                while to_settle in done:
                    outcome = done.pop(to_settle)
                    item, end_offset = waiting.pop(to_settle)
                    self._settle(item, outcome, progress)
                    ledger.advance(end_offset, item.number)
                    to_settle += 1
                    self._check_failures()
                ledger.checkpoint()
                progress.show(settled.failed - failed_before, self.dead)
            self.prompts.check_unchanged()
        except KeyboardInterrupt:
            ledger.checkpoint("interrupted", force=True)
            raise
        except RegenError as exc:
            ledger.checkpoint("stopped", force=True, error=str(exc))
            raise RegenError(f"{exc}; {settled.rows:,} rows kept in {self.request.out} and {settled.failed:,} set "
                             f"aside in {errors_path(self.request.out).name} (`--resume` continues after them)") from None
        except BaseException as exc:
            ledger.checkpoint("stopped", force=True, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            for _ in threads:
                self.work.put(None)
        ledger.checkpoint(self.job.final_status(settled), force=True, dead_servers=self.dead)
        progress.show(settled.failed - failed_before, self.dead, final=True)
        return self._result(started, resumed_from, rows_before, failed_before, tokens_before)

    def _take(self, done: dict[int, Outcome]) -> None:
        """The workers' next message, if one comes within PROGRESS_EVERY_S: a row's end, a dead server, a crash."""
        try:
            message = self.results.get(timeout=PROGRESS_EVERY_S)
        except queue.Empty:
            return
        if message[0] == "row":
            done[message[1].index] = message[1]
        elif message[0] == "dead":
            self._server_died(message[1], message[2])
        elif message[0] == "crash":
            raise RuntimeError(f"a worker for {message[1]} failed: {message[2]}")

    def _settle(self, item: Item, outcome: Outcome, progress: Progress) -> None:
        observed = self.ledger.settled.observed
        if self.on_settle is not None:
            self.on_settle(item, outcome)
        outcome = self.job.settle(outcome, self.ledger.settled)
        if outcome.rejected is not None:
            observed["rejected"][outcome.rejected] = observed["rejected"].get(outcome.rejected, 0) + 1
        elif outcome.line is not None:
            self.ledger.write_row(outcome.line)
        else:
            record = {"line": item.number, "reason": outcome.failure, "server": outcome.server}
            self.ledger.write_failure((json.dumps(record, ensure_ascii=False) + "\n").encode())
        observed["requests"] += len(outcome.tokens)
        observed["generated_tokens"] += sum(tokens or 0 for tokens in outcome.tokens)
        observed["tokens_unreported"] += sum(tokens is None for tokens in outcome.tokens)
        for finish in outcome.finish:
            key = finish or "unreported"
            observed["finish_reasons"][key] = observed["finish_reasons"].get(key, 0) + 1
        if outcome.line is not None and outcome.rejected is None:
            observed["answered_by"][outcome.server] = observed["answered_by"].get(outcome.server, 0) + 1
        progress.add(sum(tokens or 0 for tokens in outcome.tokens))

    def _check_failures(self) -> None:
        failed = self.ledger.settled.failed
        if self.max_failures is not None and failed > self.max_failures:
            raise RegenError(f"{failed:,} rows set aside, more than --max-failures {self.request.max_failures} "
                             f"allows (reasons in {errors_path(self.request.out)})")

    def _server_died(self, url: str, reason: str) -> None:
        if url in self.dead:
            return
        self.dead[url] = reason
        alive = [server.url for server in self.servers if server.url not in self.dead]
        if not alive:
            raise RegenError("every server stopped answering (" + "; ".join(self.dead.values()) + ")")
        print(printable(f"regenerate: {url} stopped answering ({reason}); {len(alive)} server(s) go on"),
              file=sys.stderr, flush=True)

    def _result(self, started: float, resumed_from: int, rows_before: int, failed_before: int,
                tokens_before: int) -> RegenResult:
        settled, out = self.ledger.settled, self.request.out
        seconds = time.monotonic() - started
        written = settled.rows - rows_before
        tokens = settled.observed["generated_tokens"] - tokens_before
        return RegenResult(str(out), str(manifest_path(out)), str(errors_path(out)), self.model, settled.rows,
                           settled.failed, written, settled.failed - failed_before, resumed_from, tokens,
                           round(seconds, 2), round(written / max(seconds, 1e-9), 2),
                           round(tokens / max(seconds, 1e-9), 1), dict(self.dead))


class Regeneration:
    """`data regenerate`'s work: each prompt row answered, every assistant turn in order (row_requests.py)."""

    def __init__(self, request: RegenRequest):
        self.request = request

    def sampling(self, model: str) -> dict:
        sampling = {"model": model, "max_tokens": self.request.max_tokens, "temperature": self.request.temperature}
        if self.request.chat_template_kwargs:
            sampling["chat_template_kwargs"] = self.request.chat_template_kwargs
        return sampling

    def item(self, index: int, number: int, raw: bytes) -> Item:
        try:
            row = loads_exchanged_json(raw)
            return Item(index, number, row, plan_for(row, self.request.turns))
        except (ValueError, BadRow) as exc:
            raise RegenError(f"{self.request.prompts}:{number}: not a prompt row ({printable(exc)})") from None

    def answer(self, server: openai_api.Server, item: Item, model: str) -> Outcome:
        plan, request = item.plan, self.request
        answers, outcome = [], Outcome(item.index, server=server.url)
        if plan.set_aside:
            outcome.failure = plan.set_aside
            return outcome
        for step in range(max(1, len(plan.answer_at))):
            if plan.endpoint == "completions":
                payload = {"prompt": plan.prompt}
            else:
                payload = {"messages": chat_history(plan, answers)[:plan.answer_at[step]]}
            try:
                reply = server.generate(plan.endpoint, self.sampling(model) | payload, max_tokens=request.max_tokens,
                                        retries=request.retries, backoff_s=request.backoff_s,
                                        timeout_s=request.request_timeout_s)
            except openai_api.RowFailed as exc:
                where = f" (turn {plan.answer_at[step] + 1})" if plan.endpoint == "chat/completions" else ""
                outcome.failure = f"{exc}{where}"
                return outcome
            answers.append(reply.text)
            outcome.tokens.append(reply.tokens)
            outcome.finish.append(reply.finish_reason)
        outcome.line = (json.dumps(training_row(item.row, plan, answers), ensure_ascii=False) + "\n").encode()
        return outcome

    name = "regenerate"

    def enough(self, settled) -> bool:
        return False  # every row of the file

    def more_in_flight(self, settled, in_flight: int) -> bool:
        return True  # the window bounds it

    def settle(self, outcome: Outcome, settled) -> Outcome:
        return outcome

    def final_status(self, settled) -> str:
        return "complete"


class Progress:
    """rows/s, generated tok/s, rows set aside and an ETA on stderr, every couple of seconds."""

    def __init__(self, name: str, total: int, done: int):
        self.name, self.total, self.done = name, total, done
        self.started = self.last = time.monotonic()
        self.rows = self.tokens = self.shown = 0

    def add(self, tokens: int) -> None:
        self.rows += 1
        self.tokens += tokens

    def show(self, failed: int, dead: dict, final: bool = False) -> None:
        now = time.monotonic()
        quiet_for = now - self.last
        if not final and (quiet_for < PROGRESS_EVERY_S or (self.rows == self.shown and quiet_for < QUIET_PROGRESS_S)):
            return
        self.last, self.shown = now, self.rows
        seconds = max(now - self.started, 1e-9)
        rate = self.rows / seconds
        settled = self.done + self.rows
        left = self.total - settled
        eta = f", ETA {_clock(left / rate)}" if rate > 0 and left > 0 else ""
        dead_note = f", {len(dead)} server(s) dead" if dead else ""
        print(f"{self.name}: {settled:,}/{self.total:,} rows ({rate:,.1f} rows/s, {self.tokens / seconds:,.0f} generated "
              f"tok/s, {failed:,} set aside{dead_note}){eta}", file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
