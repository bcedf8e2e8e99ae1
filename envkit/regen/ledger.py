"""What a regeneration has written and what its manifest vouches for: OUT (the training rows, the input's order),
OUT.errors.jsonl (the rows set aside: input line, reason, server) and OUT.manifest.json, owned by one run at a time.

The manifest is a checkpoint. Every second the two files are flushed and fsynced, then the manifest records how far
they go (bytes, rows, sha256 of those bytes) and where the prompt file was read up to. A kill at any point leaves
files that run past the last checkpoint at most; `--resume` checks the bytes the manifest vouches for (a row edited,
lost or added by hand is refused), cuts what came after, and reads on from the recorded offset: the files an
uninterrupted run writes, in bounded memory whatever their size.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from envkit.errors import RegenError
from envkit.regen import merge
from envkit.support.fsops import write_json_atomic
from envkit.support.text import printable
from envkit.support.trainer_helpers import open_lock_file, read_json_file

MANIFEST_FORMAT = 2  # 2: settled checkpoints, an errors file, every server's engine, what the replies showed
CHECKPOINT_EVERY_S = 1.0


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + ".manifest.json")


def errors_path(out: Path) -> Path:
    return out.with_name(out.name + ".errors.jsonl")


def lock_path(out: Path) -> Path:
    return out.with_name(out.name + ".lock")


@dataclass
class Settled:
    """How far a run has got, in the input and in both files: what a checkpoint records."""
    input_offset: int = 0  # bytes of the prompt file read and settled
    input_line: int = 0  # its last line settled
    rows: int = 0  # rows in OUT
    failed: int = 0  # rows in OUT.errors.jsonl
    out_bytes: int = 0
    errors_bytes: int = 0
    observed: dict = field(default_factory=lambda: {"generated_tokens": 0, "requests": 0, "tokens_unreported": 0,
                                                     "finish_reasons": {}, "answered_by": {}, "rejected": {}})


class _HashedAppend:
    """A file appended to with the sha256 of all its bytes kept up to date (the prefix already there included)."""

    def __init__(self, path: Path, keep: int, expected_sha256: str | None, what: str):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        self.handle = os.fdopen(fd, "rb+", buffering=0)
        self.digest = hashlib.sha256()
        size = os.fstat(fd).st_size
        if size < keep:
            raise RegenError(f"{path} holds {size:,} bytes where the manifest vouches for {keep:,}: rows were removed "
                             f"since regenerate wrote it; start over (remove it and the manifest) or use another --out")
        remaining = keep
        while remaining:
            chunk = self.handle.read(min(remaining, 1 << 20))
            self.digest.update(chunk)
            remaining -= len(chunk)
        if expected_sha256 is not None and self.digest.hexdigest() != expected_sha256:
            raise RegenError(f"{path}: its first {keep:,} bytes are not the ones regenerate wrote ({what} was edited "
                             f"since); start over (remove it and the manifest) or use another --out")
        self.handle.truncate(keep)  # rows written after the last checkpoint: answered again
        self.handle.seek(keep)
        self.size = keep
        self.pending = bytearray()

    def write(self, data: bytes) -> None:
        self.pending += data
        self.digest.update(data)
        self.size += len(data)
        if len(self.pending) >= 1 << 20:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.handle.write(self.pending)
            self.pending.clear()

    def sync(self) -> None:
        self.flush()
        os.fsync(self.handle.fileno())

    def sha256(self) -> str:
        return self.digest.copy().hexdigest()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.handle.close()


class Ledger:
    """The one writer of OUT, its errors file and its manifest for the length of a run."""

    def __init__(self, out: Path, manifest: dict, resume: bool):
        self.out = out
        self._lock_fd = _own(out)
        try:
            merge.recover(out)  # a retry's merge a kill interrupted: finished or undone, before OUT is read
            before = self._earlier(manifest, resume)
            self.settled = _settled_from(before) if before else Settled()
            checkpoint = (before or {}).get("settled") or {}
            self.out_file = _HashedAppend(out, self.settled.out_bytes, checkpoint.get("out_sha256"), "OUT")
            self.errors_file = _HashedAppend(errors_path(out), self.settled.errors_bytes,
                                             checkpoint.get("errors_sha256"), "the errors file")
        except BaseException:
            self._release()
            raise
        self.already_complete = bool(before and before.get("status") == "complete")
        self.manifest = manifest
        self.last_checkpoint = 0.0

    def _earlier(self, manifest: dict, resume: bool) -> dict | None:
        out, record_path = self.out, manifest_path(self.out)
        exists = out.exists() or errors_path(out).exists()
        if not exists and not record_path.exists():
            return None
        if not resume:
            raise RegenError(f"{out} exists; pass --resume to continue it, or remove it (and {record_path.name}, "
                             f"{errors_path(out).name})")
        try:
            before = read_json_file(record_path, limit=16 << 20)
        except ValueError:
            before = None
        same = isinstance(before, dict) and all(before.get(key) == manifest[key] for key in
                                                ("format", "prompts_sha256", "model", "settings"))
        if not same or not isinstance(before.get("settled"), dict):
            raise RegenError(f"{out} was not made by this regeneration (its manifest names other prompts, model or "
                             f"settings, or is missing); write to another --out, or remove it to start over")
        if before["settled"].get("input_line", 0) > manifest["prompts_lines"]:
            raise RegenError(f"{out}'s manifest has settled line {before['settled']['input_line']} of a prompt file "
                             f"of {manifest['prompts_lines']} lines; it was not made from these prompts")
        return before

    # -- writing ----------------------------------------------------------------------------------------------
    def write_row(self, line: bytes) -> None:
        self.out_file.write(line)
        self.settled.rows += 1

    def write_failure(self, line: bytes) -> None:
        self.errors_file.write(line)
        self.settled.failed += 1

    def advance(self, input_offset: int, input_line: int) -> None:
        self.settled.input_offset, self.settled.input_line = input_offset, input_line

    def checkpoint(self, status: str = "running", force: bool = False, **extra) -> None:
        """fsync both files, then record how far they go; at most once a second unless forced."""
        now = time.monotonic()
        if not force and now - self.last_checkpoint < CHECKPOINT_EVERY_S:
            return
        self.last_checkpoint = now
        self.out_file.sync()
        self.errors_file.sync()
        settled = self.settled
        record = self.manifest | {
            "status": status, "rows": settled.rows, "failed": settled.failed, "total": self.manifest["prompts_rows"],
            "observed": settled.observed, "errors_file": errors_path(self.out).name,
            "settled": {"input_offset": settled.input_offset, "input_line": settled.input_line,
                        "rows": settled.rows, "failed": settled.failed,
                        "out_bytes": self.out_file.size, "out_sha256": self.out_file.sha256(),
                        "errors_bytes": self.errors_file.size, "errors_sha256": self.errors_file.sha256()},
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())} | extra
        if status == "complete":
            record |= {"output_sha256": self.out_file.sha256(), "errors_sha256": self.errors_file.sha256()}
        write_json_atomic(manifest_path(self.out), record, mode=0o644)

    def close(self) -> None:
        try:
            self.out_file.close()
            self.errors_file.close()
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the lock
            self._lock_fd = None


def _settled_from(before: dict) -> Settled:
    checkpoint = before["settled"]
    values = {}
    for key in ("input_offset", "input_line", "rows", "failed", "out_bytes", "errors_bytes"):
        value = checkpoint.get(key)
        if type(value) is not int or value < 0:
            raise RegenError(f"the manifest's settled.{key} is {printable(value)[:40]}, not a count; start over "
                             f"(remove OUT and its manifest) or use another --out")
        values[key] = value
    observed = before.get("observed")
    settled = Settled(**values)
    if isinstance(observed, dict):
        settled.observed.update({key: observed[key] for key in settled.observed if key in observed})
    return settled


def _own(out: Path) -> int:
    """An exclusive, non-blocking lock on OUT.lock for the run: a second regenerate of the same OUT is refused
    while this one lives (the kernel drops the lock with the process, so a kill leaves nothing to clean)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = open_lock_file(lock_path(out))
    except ValueError as exc:
        raise RegenError(f"{exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise RegenError(f"{out} is being written by another `envkit data regenerate` (pid {printable(holder) or '?'}); "
                         f"wait for it to end, or stop it, before resuming") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
