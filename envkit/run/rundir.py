"""A run directory and its files: the one owner of run.json's format.

RUN_DIR/run.json (status, command, versions, cache, summary), config.json (the resolved config that
describe, warm-up and train read), train.log, metrics.jsonl, summary.json, checkpoint.pt.
"""

from __future__ import annotations

import contextlib
import re
from datetime import datetime, timezone
from pathlib import Path

from envkit.errors import RunError
from envkit.support.fsops import write_json_atomic
from envkit.support.text import printable
from envkit.support.trainer_helpers import ExclusiveLock, read_json_file

RUN_JSON = "run.json"
CONFIG_JSON = "config.json"
SUMMARY_JSON = "summary.json"
NODE_JSON = "node.json"  # under torchrun: which node of the rendezvous this run dir's node was
LOG = "train.log"
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def boot_id() -> str | None:
    """This boot of this machine (Linux), so that a run dir copied from another host, or kept over a reboot,
    is never taken for a live run by its pids."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_run_name(name: str) -> str:
    if not RUN_NAME.fullmatch(name):
        raise RunError(f"run name {name[:120]!r} must be 1-100 letters, digits, '.', '_' or '-', starting with a letter "
                       f"or digit; choose another --name")
    return name


RUN_LOCK = ".run.lock"


@contextlib.contextmanager
def _locked(run_dir: Path):
    """One read-change-write of run.json at a time, across processes (a supervisor, `serve --stop`, a launcher):
    without it, two writers each write back a record without the other's change."""
    try:
        lock = ExclusiveLock(run_dir / RUN_LOCK)
    except ValueError as exc:  # the lock file refused; what the block raises passes as it is
        raise RunError(f"{exc}") from None
    with lock:
        yield


def update_run(run_dir: Path, **fields) -> dict:
    """Read, change, write atomically, under the run's lock: readers see the old record or the new one, and no
    writer's change is lost to another's."""
    with _locked(run_dir):
        record = read_run(run_dir)
        record.update(fields)
        write_json_atomic(run_dir / RUN_JSON, record)
        return record


def request_stop(run_dir: Path, status: str, error: str | None = None) -> dict:
    """Ask the supervisor to end the run as `status` ("stopped", "failed"): it reads this before it starts the
    command and when the command ends, so the end it records is the one asked for (one writer of the end)."""
    fields = {"stop_requested": status, **({"stop_error": error} if error else {})}
    return update_run(run_dir, **fields)


RECORD_LIMIT = 16 << 20  # a run.json holds a config and a summary: kilobytes


def read_run(run_dir: Path) -> dict:
    """run.json as data: a regular file (a FIFO cannot hang this, a link is not followed), bounded, a JSON object."""
    try:
        record = read_json_file(run_dir / RUN_JSON, limit=RECORD_LIMIT)
    except ValueError as exc:
        raise RunError(f"{printable(run_dir / RUN_JSON)} is unreadable ({exc})") from None
    if not isinstance(record, dict):
        raise RunError(f"{printable(run_dir / RUN_JSON)} is not a run record (a JSON object); it was not written by "
                       f"envkit")
    return record


def _trainer_record(path: Path) -> dict | None:
    """A JSON object the trainer wrote, or None when it is absent or not one (read as data)."""
    try:
        record = read_json_file(path, limit=RECORD_LIMIT)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_node(run_dir: Path) -> dict | None:
    """The trainer's node.json (group rank, nodes, whether the writer, global rank 0, ran here)."""
    return _trainer_record(run_dir / NODE_JSON)


def read_summary(run_dir: Path) -> dict | None:
    """The trainer's summary.json (results are files, not lines in a log)."""
    return _trainer_record(run_dir / SUMMARY_JSON)




@contextlib.contextmanager
def end_recorded_if_unsupervised(run_dir: Path):
    """Within: a failure or Ctrl-C before the supervisor took the run over is still recorded in run.json."""
    try:
        yield
    except BaseException as exc:
        if read_run(run_dir).get("status") == "starting":
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            update_run(run_dir, status=status, ended_at=now(), error=str(exc) or type(exc).__name__)
        raise
