"""Hazard mitigations proven in a venv: run the trainer's self-tests there and record what they showed.

`prove()` runs `python -m trainer selftest` in the venv with the environment training gets (the
private cache dirs, the warm lock held) and writes `<venv>/envkit-selftest.json` with the torch
version and the trainer's source digest it ran against. Doctor calls a hazard mitigated only when
that record passed for the torch installed now and the trainer source present now (`status()`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from envkit.errors import CacheError
from envkit.trainer_process import run_trainer, trainer_env
from envkit.fsops import write_json_atomic
from envkit.venv import Venv
from trainer.files import read_json_file
from trainer.mitigations import MITIGATIONS, RESULTS_FILE, WARM_LOCK_ENV


def record_path(venv: Venv) -> Path:
    return venv.path / RESULTS_FILE


def prove(venv: Venv, cache_dir: Path, lock: FileLock, trainer_digest: str) -> dict:
    """Run every self-test in the venv while `lock` (the cache's warm lock) is held; record and return it."""
    with lock:
        return prove_holding(venv, cache_dir, lock.lock_file, trainer_digest)


def prove_holding(venv: Venv, cache_dir: Path, lock_file: str, trainer_digest: str) -> dict:
    """`prove` for a caller that already holds the warm lock at `lock_file` (warm-cache runs the self-tests
    beside its compile: the compile keeps one core busy, the self-tests take the other)."""
    env = trainer_env(venv, cache_dir) | {WARM_LOCK_ENV: lock_file}
    # Exit 1 means a self-test failed: that is a result to record, not an error of the run.
    proc = run_trainer(venv, ["selftest"], env, timeout=600, ok_codes=(0, 1))
    try:
        output = json.loads(proc.stdout.strip().splitlines()[-1])
        results = output["results"]
        torch_version = output["torch"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise CacheError(f"`python -m trainer selftest` in {venv.path} printed no result:\n  {proc.stderr[-2000:]}")
    record = {"torch": torch_version, "trainer": trainer_digest, "results": results,
              "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json_atomic(record_path(venv), record)
    return record


def read(venv: Venv) -> dict | None:
    """The venv's recorded self-tests, or None when absent or not a record envkit wrote (read as data)."""
    path = record_path(venv)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        record = read_json_file(path, limit=1 << 20)
    except ValueError:
        return None
    if not (isinstance(record, dict) and isinstance(record.get("torch"), str)
            and isinstance(record.get("trainer"), str) and isinstance(record.get("results"), dict)):
        return None
    return record


def status(record: dict | None, torch_version: str | None, trainer_digest: str, hazard: str) -> tuple[str, str]:
    """('passed' | 'failed' | 'unverified', what the self-test showed or why it does not count)."""
    mitigation = MITIGATIONS.get(hazard)
    if mitigation is None:
        return "unverified", "the trainer has no mitigation for it"
    if record is None:
        return "unverified", "its self-test has not run in this venv"
    if record["torch"] != torch_version:
        return "unverified", f"its self-test ran against torch {record['torch']}, not the installed one"
    if record["trainer"] != trainer_digest:
        return "unverified", "its self-test ran against another trainer source"
    result = record["results"].get(hazard)
    if not isinstance(result, dict) or not isinstance(result.get("passed"), bool):
        return "unverified", "its self-test result is missing"
    detail = str(result.get("detail", ""))[:300]
    return ("passed" if result["passed"] else "failed"), detail


def is_current(venv: Venv, torch_version: str | None, trainer_digest: str) -> bool:
    """Whether the venv's record covers every mitigation for this torch and this trainer source."""
    record = read(venv)
    return all(status(record, torch_version, trainer_digest, hazard)[0] != "unverified" for hazard in MITIGATIONS)


def passed_by_hazard(record: dict | None) -> dict[str, bool]:
    results = (record or {}).get("results", {})
    return {hazard: bool(result.get("passed")) for hazard, result in results.items() if isinstance(result, dict)}


def render(record: dict) -> str:
    """One line per hazard: what the self-test showed."""
    lines = []
    for hazard, result in record["results"].items():
        verdict = "passed" if result.get("passed") else "FAILED"
        lines.append(f"  {hazard} {result.get('selftest')}: {verdict}: {result.get('detail')}")
    return "\n".join(lines)
