"""`envkit data regenerate`: every prompt row answered by the target through serving engines, written as training data.

Rows go round-robin over the servers, at most `concurrency` in flight; the output keeps the input's order and is
appended whole rows at a time, so a kill leaves only whole lines (a torn last line is cut on resume) and
`--resume` continues after the last one, giving the file an uninterrupted run gives. The manifest beside the output
(OUT.manifest.json) says what produced it: the prompt file's sha256, the model and engine as the servers report
them, the sampling settings, counts, and each failed row with its reason; a token store prepared from OUT records it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from envkit import __version__
from envkit.errors import EnvkitError
from envkit.regen import client as api
from envkit.regen.rows import BadRow, Request, answered, request_for
from envkit.support.fsops import write_json_atomic
from envkit.support.text import printable
from trainer.common.files import file_sha256, loads_json, read_json_file

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = 1
ROW_LIMIT = 64 << 20  # a prompt row is parsed whole


class RegenError(EnvkitError):
    """Regeneration stopped: a bad row, a refused row, a server gone; the rows written before it are kept."""


@dataclass(frozen=True)
class RegenRequest:
    servers: tuple[str, ...]
    prompts: Path
    out: Path
    model: str | None = None
    concurrency: int = 8
    max_tokens: int = 512
    temperature: float = 0.0
    chat_template_kwargs: dict | None = None
    resume: bool = False
    retries: int = 5
    backoff_s: float = 0.5
    connect_timeout_s: float = 60.0
    request_timeout_s: float = 600.0


@dataclass
class RegenResult:
    out: str
    manifest: str
    model: str
    rows: int  # rows in the output (this run's and a resumed run's before it)
    written_now: int
    resumed_from: int
    generated_tokens: int
    seconds: float
    rows_per_s: float
    tokens_per_s: float
    failed: list = field(default_factory=list)


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + MANIFEST_SUFFIX)


def base_url(server: str) -> str:
    """`http://host:port`, `http://host:port/` or `.../v1` to the server's base URL; anything else is refused."""
    parts = urlsplit(server.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise RegenError(f"--server {printable(server)!r} is not an http(s) URL of a server (e.g. http://127.0.0.1:8000)")
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


def _prompt_rows(path: Path):
    """(line number, raw bytes) of every non-blank line; a line is read whole, up to ROW_LIMIT."""
    with path.open("rb") as handle:
        for number, line in enumerate(iter(lambda: handle.readline(ROW_LIMIT + 1), b""), 1):
            if len(line) > ROW_LIMIT:
                raise RegenError(f"{path}:{number}: a row over {ROW_LIMIT >> 20} MiB; split it")
            if line.strip():
                yield number, line


def _whole_lines(out: Path) -> int:
    """Complete rows already in `out`; a torn last line (a kill mid-write) is cut off."""
    with out.open("rb+") as handle:
        data = handle.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            handle.truncate(keep)
    return data[:keep].count(b"\n")


def _settings(request: RegenRequest) -> dict:
    return {"max_tokens": request.max_tokens, "temperature": request.temperature,
            "chat_template_kwargs": request.chat_template_kwargs}


def _choose_model(listed: dict[str, list[str]], wanted: str | None) -> str:
    for url, models in listed.items():
        if wanted is not None and wanted not in models:
            raise RegenError(f"{url} serves {printable(models[:8])}, not {printable(wanted)!r}; give --model one of them")
    if wanted is not None:
        return wanted
    common = sorted(set.intersection(*(set(models) for models in listed.values())))
    if len(common) != 1:
        raise RegenError(f"the servers serve {printable(common[:8]) or 'no common model'}; give --model ID")
    return common[0]


def _resume_point(request: RegenRequest, manifest: dict) -> int:
    out = request.out
    if not out.exists():
        return 0
    if not request.resume:
        raise RegenError(f"{out} exists; pass --resume to continue it, or remove it (and {manifest_path(out).name})")
    try:
        before = read_json_file(manifest_path(out))
    except ValueError:
        before = None
    same = isinstance(before, dict) and all(before.get(key) == manifest[key] for key in
                                            ("format", "prompts_sha256", "model", "settings"))
    if not same:
        raise RegenError(f"{out} was not made by this regeneration (its manifest names other prompts, model or "
                         f"settings, or is missing); write to another --out, or remove it to start over")
    return _whole_lines(out)


class _Progress:
    def __init__(self, total: int, done: int, every_s: float = 2.0):
        self.total, self.done, self.every_s = total, done, every_s
        self.started = self.last = time.monotonic()
        self.rows = self.tokens = 0

    def add(self, tokens: int | None) -> None:
        self.rows += 1
        self.tokens += tokens or 0
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done + self.rows == self.total:
            self.last = now
            seconds = max(now - self.started, 1e-9)
            print(f"regenerate: {self.done + self.rows}/{self.total} rows ({self.rows / seconds:.2f} rows/s, "
                  f"{self.tokens / seconds:.0f} generated tok/s)", file=sys.stderr, flush=True)


def regenerate(request: RegenRequest) -> RegenResult:
    """Answer every prompt row of `request.prompts` into `request.out` (see the module docstring)."""
    if not request.prompts.is_file():
        raise RegenError(f"--data {request.prompts}: not a file")
    servers = [base_url(server) for server in request.servers]
    timeout = httpx.Timeout(request.request_timeout_s, connect=10.0)
    with httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=request.concurrency + 4)) as http:
        listed = {url: api.wait_for_models(http, url, request.connect_timeout_s) for url in servers}
        model = _choose_model(listed, request.model)
        manifest = {"format": MANIFEST_FORMAT, "prompts": str(request.prompts.absolute()),
                    "prompts_sha256": file_sha256(request.prompts), "model": model, "settings": _settings(request),
                    "servers": servers, "engine": api.engine_version(http, servers[0]), "envkit": __version__}
        done = _resume_point(request, manifest)
        request.out.parent.mkdir(parents=True, exist_ok=True)
        total = sum(1 for _ in _prompt_rows(request.prompts))
        write_json_atomic(manifest_path(request.out), manifest | {"status": "running", "rows": done, "total": total})
        started = time.monotonic()
        progress = _Progress(total, done)
        failed: list[dict] = []
        try:
            written = _answer_rows(http, servers, model, request, done, progress, failed)
        except (RegenError, api.ServerError) as exc:
            rows = done + progress.rows
            write_json_atomic(manifest_path(request.out), manifest | {"status": "stopped", "rows": rows, "total": total,
                                                                       "failed": failed})
            raise RegenError(f"{exc}; {rows} rows kept in {request.out} (`--resume` continues after them)") from None
    seconds = time.monotonic() - started
    rows = done + written
    write_json_atomic(manifest_path(request.out), manifest | {
        "status": "complete", "rows": rows, "total": total, "failed": failed,
        "generated_tokens_this_run": progress.tokens, "output_sha256": file_sha256(request.out)})
    return RegenResult(str(request.out), str(manifest_path(request.out)), model, rows, written, done, progress.tokens,
                       round(seconds, 2), round(written / max(seconds, 1e-9), 2),
                       round(progress.tokens / max(seconds, 1e-9), 1), failed)


def _answer_rows(http: httpx.Client, servers: list[str], model: str, request: RegenRequest, skip: int,
                 progress: _Progress, failed: list[dict]) -> int:
    """Ask for every row after the first `skip`, `concurrency` at a time, and append the answers in input order.
    The first row that cannot be answered stops the run after the rows before it are written."""
    sampling = {"model": model, "max_tokens": request.max_tokens, "temperature": request.temperature}
    if request.chat_template_kwargs:
        sampling["chat_template_kwargs"] = request.chat_template_kwargs
    rows = _prompt_rows(request.prompts)
    for _ in range(skip):
        next(rows)
    pending: dict[int, tuple[int, dict, Request, Future]] = {}
    finished: dict[int, tuple[dict, int | None]] = {}
    next_index, to_write, written, stop = skip, skip, 0, None
    with ThreadPoolExecutor(max_workers=request.concurrency) as pool, request.out.open("ab") as out:
        while True:
            while stop is None and len(pending) < request.concurrency:
                item = next(rows, None)
                if item is None:
                    break
                number, line = item
                try:
                    row = loads_json(line)
                    ask = request_for(row)
                except (ValueError, BadRow) as exc:
                    stop = (next_index, number, f"not a prompt row ({printable(exc)})")
                    break
                server = servers[next_index % len(servers)]  # round-robin by row, the same on every resume
                future = pool.submit(api.generate, http, server, ask.endpoint, sampling | ask.payload,
                                     retries=request.retries, backoff_s=request.backoff_s)
                pending[next_index] = (number, row, ask, future)
                next_index += 1
            if not pending:
                break
            wait([entry[3] for entry in pending.values()], return_when=FIRST_COMPLETED)
            for index in sorted(pending):
                number, row, ask, future = pending[index]
                if not future.done():
                    continue
                del pending[index]
                try:
                    reply = future.result()
                except (api.RowRefused, api.ServerError) as exc:
                    reason = f"the server refused the row ({exc})" if isinstance(exc, api.RowRefused) else str(exc)
                    if stop is None or index < stop[0]:  # the first row in input order that failed
                        stop = (index, number, reason)
                    continue
                finished[index] = (answered(row, ask, reply.text), reply.tokens)
            while to_write in finished and (stop is None or to_write < stop[0]):
                line_row, tokens = finished.pop(to_write)
                out.write((json.dumps(line_row, ensure_ascii=False) + "\n").encode())
                out.flush()
                to_write += 1
                written += 1
                progress.add(tokens)
            if stop is not None and not any(index < stop[0] for index in pending):
                break
        os.fsync(out.fileno())
    if stop is not None:
        index, number, reason = stop
        failed.append({"line": number, "reason": reason})
        where = f"{request.prompts}:{number}"
        raise RegenError(f"{where}: {reason}")
    return written
