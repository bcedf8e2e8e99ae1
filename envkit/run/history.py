"""`envkit runs` and `envkit logs`: what happened in each run directory."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from envkit import paths
from envkit.errors import RunError
from envkit.run.rundir import LOG, RUN_JSON, boot_id, check_run_name, read_run
from envkit.support.safeio import UnsafeFile, open_regular, read_text
from envkit.support.text import printable
from envkit.support.trainer_helpers import loads_json

METRICS_LIMIT = 256 << 20


def alive(pid) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False  # a pid run.json gives must be one; never signal group 0 or -1
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _metrics(run_dir: Path) -> tuple[dict, dict]:
    """The last step row and the last eval row of metrics.jsonl."""
    last_step, last_eval = {}, {}
    try:
        lines = read_text(run_dir / "metrics.jsonl", METRICS_LIMIT).splitlines()
    except UnsafeFile:
        return last_step, last_eval
    for line in lines:
        try:
            row = loads_json(line)
        except ValueError:
            continue  # a line being written right now
        if not isinstance(row, dict):
            continue
        if row.get("eval") and ("walk_tau" in row or "walk_tau" not in last_eval):
            last_eval = row  # a walk row, once there is one, wins over teacher-forced rows
        elif "loss" in row:
            last_step = row
    return last_step, last_eval


def started_here(record: dict) -> bool:
    """Whether the run was started on this machine since it booted (a pid means something only there)."""
    # A record without a host or boot id (written before envkit recorded them) is taken as this machine's.
    return record.get("host") in (None, socket.gethostname()) and record.get("boot_id") in (None, boot_id())


def status_of(record: dict) -> str:
    status = record.get("status", "unknown")
    if not isinstance(status, str):
        return "invalid"
    if status in ("running", "starting") and not started_here(record):
        return "elsewhere"  # its pids are another machine's: nothing here can say it is alive
    if status == "running" and not alive(record.get("supervisor_pid")):
        return "lost"  # the supervisor died without recording an end (SIGKILL, reboot)
    if status == "starting" and not alive(record.get("launcher_pid")) and not alive(record.get("supervisor_pid")):
        return "lost"  # killed between preflight and supervision
    return status


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _row(run_dir: Path) -> dict:
    """One run's row; a run.json that is unreadable or of the wrong shape is a row saying so, never an error
    that hides every other run."""
    row = {"name": run_dir.name, "status": "invalid", "started_at": None, "step": None, "loss": None,
           "tokens_per_s": None, "acceptance_length": None, "tau_method": None, "cache_hits": None,
           "cache_misses": None, "run_dir": str(run_dir)}
    try:
        record = read_run(run_dir)
    except RunError as exc:
        return row | {"error": str(exc)}
    last_step, last_eval = _metrics(run_dir)
    summary = record.get("summary") if isinstance(record.get("summary"), dict) else {}
    started = record.get("started_at")
    return row | {
        "status": status_of(record), "started_at": started if isinstance(started, str) else None,
        "step": _number(last_step.get("step")), "loss": _number(last_step.get("loss")),
        "tokens_per_s": _number(last_step.get("tokens_per_s")),
        "acceptance_length": _number(last_eval.get("walk_tau", last_eval.get("acceptance_length"))),
        "tau_method": last_eval.get("method") if isinstance(last_eval.get("method"), str) else None,
        "cache_hits": _number(summary.get("fxgraph_cache_hit")), "cache_misses": _number(summary.get("fxgraph_cache_miss"))}


def list_runs(runs_dir: Path | None = None) -> list[dict]:
    root = runs_dir or paths.runs_dir()
    return [_row(run_json.parent) for run_json in sorted(root.glob(f"*/{RUN_JSON}"))]


def find_run(name: str, runs_dir: Path | None = None) -> Path:
    check_run_name(name)  # a name, not a path: `../x` never leaves the runs dir
    run_dir = (runs_dir or paths.runs_dir()) / name
    if not (run_dir / RUN_JSON).exists():
        known = ", ".join(r["name"] for r in list_runs(runs_dir)[-5:]) or "none"
        raise RunError(f"no run named {printable(name)!r} in {printable(run_dir.parent)} (recent: {printable(known)}); "
                       f"see `envkit runs`")
    read_run(run_dir)  # a record of the wrong shape is an error here, not a traceback later
    return run_dir


def follow_log(run_dir: Path, *, follow: bool, out=None) -> None:
    """Print train.log; with follow, keep printing until the run ends."""
    out = out or sys.stdout
    position = 0
    while True:
        try:
            fd, _info = open_regular(run_dir / LOG)
            with os.fdopen(fd, "rb") as handle:
                handle.seek(position)
                chunk = handle.read(1 << 24)
        except UnsafeFile:
            chunk = b""
        if chunk:
            out.write(printable(chunk.decode(errors="replace"), keep_newlines=True))
            out.flush()
            position += len(chunk)
        if not follow or status_of(read_run(run_dir)) not in ("running", "starting"):
            if not follow or not chunk:
                return
        time.sleep(0.5)
