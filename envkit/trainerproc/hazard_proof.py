"""Hazard mitigations proven in a venv: run the trainer's self-tests there and record what they showed.

`prove()` runs `python -m trainer selftest` in the venv with the environment training gets (the
private cache dirs, the warm lock held) and records the result in envkit's own state (envkit/support/state.py),
never in the venv: a record a venv carries is its own word. The record is bound to the venv's identity
(path, directory inode) and to what the test ran against (the torch version, the digest of torch's
RECORD, the trainer's source digest). Doctor calls a hazard mitigated only when such a record passed
for this venv, the torch installed now and the trainer source present now (`status()`).
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from envkit.support import state
from envkit.errors import CacheError, VenvError
from envkit.support.safeio import UnsafeFile, read_bytes
from envkit.trainerproc.process import run_trainer, trainer_env
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import MITIGATIONS, WARM_LOCK_ENV


KIND = "selftest"


def record_path(venv: Venv) -> Path:
    return state.record_path(KIND, state.path_key(venv.path))


def _subject(venv: Venv) -> dict:
    """What a self-test record is bound to: this venv (path and directory inode) and its torch's RECORD."""
    try:
        info = os.stat(venv.path)
        site = venv.site_packages()
    except (OSError, VenvError):
        return {}
    records = sorted(site.glob("torch-*.dist-info/RECORD"))
    try:
        torch_record = hashlib.sha256(read_bytes(records[0], 64 << 20)).hexdigest() if len(records) == 1 else None
    except UnsafeFile:
        torch_record = None
    return {"venv": str(venv.path.resolve()), "inode": info.st_ino, "device": info.st_dev,
            "torch_record": torch_record}


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
    record = {"torch": torch_version, "trainer": trainer_digest, "results": results, **_subject(venv),
              "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    state.write(KIND, state.path_key(venv.path), record)
    return record


def read(venv: Venv) -> dict | None:
    """envkit's record of the self-tests it ran in this very venv against the torch there now, or None."""
    record = state.read(KIND, state.path_key(venv.path))
    if not (isinstance(record, dict) and isinstance(record.get("torch"), str)
            and isinstance(record.get("trainer"), str) and isinstance(record.get("results"), dict)):
        return None
    subject = _subject(venv)
    if not subject.get("torch_record") or any(record.get(key) != value for key, value in subject.items()):
        return None  # another venv at this path, or torch's files changed since the test ran
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
