"""`envkit runs` and `envkit logs`: what happened in each run directory."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from envkit import paths
from envkit.errors import RunError
from envkit.rundir import LOG, RUN_JSON, read_run


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
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
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return last_step, last_eval
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written right now
        if row.get("eval") and ("walk_tau" in row or "walk_tau" not in last_eval):
            last_eval = row  # a walk row, once there is one, wins over teacher-forced rows
        elif "loss" in row:
            last_step = row
    return last_step, last_eval


def status_of(record: dict) -> str:
    status = record.get("status", "unknown")
    if status == "running" and not _alive(record.get("supervisor_pid")):
        return "lost"  # the supervisor died without recording an end (SIGKILL, reboot)
    if status == "starting" and not _alive(record.get("launcher_pid")) and not _alive(record.get("supervisor_pid")):
        return "lost"  # killed between preflight and supervision
    return status


def list_runs(runs_dir: Path | None = None) -> list[dict]:
    root = runs_dir or paths.runs_dir()
    rows = []
    for run_json in sorted(root.glob(f"*/{RUN_JSON}")):
        run_dir = run_json.parent
        try:
            record = read_run(run_dir)
        except RunError:
            continue
        last_step, last_eval = _metrics(run_dir)
        summary = record.get("summary") or {}
        rows.append({"name": record["name"], "status": status_of(record), "started_at": record.get("started_at"),
                     "step": last_step.get("step"), "loss": last_step.get("loss"),
                     "tokens_per_s": last_step.get("tokens_per_s"),
                     "acceptance_length": last_eval.get("walk_tau", last_eval.get("acceptance_length")),
                     "tau_method": last_eval.get("method"),
                     "cache_hits": summary.get("fxgraph_cache_hit"), "cache_misses": summary.get("fxgraph_cache_miss"),
                     "run_dir": str(run_dir)})
    return rows


def find_run(name: str, runs_dir: Path | None = None) -> Path:
    run_dir = (runs_dir or paths.runs_dir()) / name
    if not (run_dir / RUN_JSON).exists():
        known = ", ".join(r["name"] for r in list_runs(runs_dir)[-5:]) or "none"
        raise RunError(f"no run named {name!r} in {run_dir.parent} (recent: {known}); see `envkit runs`")
    read_run(run_dir)  # a record of the wrong shape is an error here, not a traceback later
    return run_dir


def follow_log(run_dir: Path, *, follow: bool, out=None) -> None:
    """Print train.log; with follow, keep printing until the run ends."""
    out = out or sys.stdout
    position = 0
    while True:
        try:
            with (run_dir / LOG).open("rb") as handle:
                handle.seek(position)
                chunk = handle.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            out.write(chunk.decode(errors="replace"))
            out.flush()
            position += len(chunk)
        if not follow or status_of(read_run(run_dir)) not in ("running", "starting"):
            if not follow or not chunk:
                return
        time.sleep(0.5)
