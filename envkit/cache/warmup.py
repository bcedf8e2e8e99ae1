"""Warming a cache: the trainer's single-threaded compile of every bucket in the venv, then the fingerprint,
with the hazard self-tests run beside it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from envkit.trainerproc import hazard_proof as selftest
from envkit.cache.fingerprint import (
    Verification,
    compare,
    fingerprints,
    read_fingerprint,
    tampered_names,
    write_fingerprint,
)
from envkit.cache.key import compile_root, ensure_private_dir, env_key, key_parts
from envkit.errors import CacheError
from envkit.support.text import printable
from envkit.trainerproc.process import (
    trainer_args,
    trainer_command,
    trainer_env,
    trainer_failure,
)
from envkit.trainerproc.source import trainer_digest
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import die_with_parent


@dataclass(frozen=True)
class WarmResult:
    cache_dir: str
    env_key: str
    buckets: list[int]
    counters: dict
    fingerprint: str
    files: int
    bytes: int
    seconds: float
    selftests: dict  # hazard -> passed, as recorded in the venv for this torch and trainer source


def _progress_bar(done: int, total: int, bucket: int, seconds: float) -> str:
    filled = int(20 * done / total)
    return f"\rwarm-cache [{'#' * filled}{'.' * (20 - filled)}] {done}/{total} buckets (last: {bucket} tokens) {seconds:.0f}s"


def _stream_warmup(venv: Venv, args: list[str], env: dict[str, str], quiet: bool) -> dict:
    """Run the trainer's warm-up, drawing its progress lines as a bar on stderr; return its final line."""
    with tempfile.TemporaryDirectory(prefix="envkit-warm-") as out, tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(trainer_command(venv, "warmup", *args, "--out", out),
                                stdout=subprocess.PIPE, stderr=errors, text=True, env=env,
                                preexec_fn=die_with_parent)
        final = None
        try:
            for line in proc.stdout:
                record = json.loads(line) if line.startswith("{") else {}
                if "progress" in record and not quiet:
                    print(_progress_bar(record["progress"], record["total"], record["bucket"], record["seconds"]),
                          end="", file=sys.stderr, flush=True)
                elif "note" in record:  # lines, not a bar: shown on a pipe too (a build can take minutes)
                    print(printable(f"warm-cache: {record['note']}"), file=sys.stderr, flush=True)
                elif "buckets" in record:
                    final = record
            proc.wait()
        except BaseException:
            proc.terminate()
            proc.wait()
            raise
        if not quiet:
            print(file=sys.stderr)
        if proc.returncode != 0 or final is None:
            errors.seek(0)
            raise trainer_failure(venv, ["warmup"], errors.read())
    return final


def _check_trusted(cache_dir: Path) -> None:
    """Refuse to re-fingerprint a cache whose fingerprinted files changed: that would launder tampering."""
    fingerprint = read_fingerprint(cache_dir)
    if fingerprint is None:
        return
    result = compare(cache_dir, fingerprint)
    if result.tampered:
        raise CacheError(f"{cache_dir} changed since it was fingerprinted ({tampered_names(result)}); it cannot be "
                         f"trusted: remove it (`rm -rf {shlex.quote(str(cache_dir))}`) and run `envkit warm-cache` again")


def layout_args(trainer_args: tuple[str, ...] | list[str]) -> list[str]:
    """The trainer flags that decide which devices compile (--targets, --drafters, --device): a threaded layout
    over several GPUs compiles for each of them, and the device index is part of every cache key."""
    out, take = [], False
    for arg in trainer_args:
        flag = arg.split("=", 1)[0]
        if take:
            out.append(arg)
            take = False
        elif flag in ("--targets", "--drafters", "--device"):
            out.append(arg)
            take = "=" not in arg
    return out


def warm(venv: Venv, preset: str | None = None, config: str | None = None, *, quiet: bool = False,
         export: Path | None = None, described: dict | None = None, layout: list[str] | tuple = ()) -> WarmResult:
    started = time.perf_counter()
    parts = key_parts(venv, preset, config, described)
    key = env_key(parts)
    cache_dir = compile_root() / key
    ensure_private_dir(cache_dir)
    lock = warm_lock(cache_dir)
    digest = trainer_digest()
    with lock, ThreadPoolExecutor(max_workers=1) as beside:
        _check_trusted(cache_dir)
        proving = None
        if not selftest.is_current(venv, parts["torch"], digest):
            proving = beside.submit(selftest.prove_holding, venv, cache_dir, lock.lock_file, digest)
        args = trainer_args(preset, config) + list(layout) + (["--export", str(export)] if export else [])
        final = _stream_warmup(venv, args, trainer_env(venv, cache_dir), quiet)
        # The fingerprint is written last: an interrupted warm-up leaves none, and the next run continues.
        fingerprint = write_fingerprint(cache_dir, parts, final["buckets"], final["counters"], venv)
        record = proving.result() if proving else selftest.read(venv)
    size = sum(s for _p, s, _h in fingerprint["files"])
    return WarmResult(str(cache_dir), key, final["buckets"], final["counters"], fingerprint["digest"],
                      len(fingerprint["files"]), size, round(time.perf_counter() - started, 2),
                      selftest.passed_by_hazard(record))


def warm_lock(cache_dir: Path) -> FileLock:
    """The lock that serialises warmers of one env key (HAZARDS.md H6); reentrant for the same object."""
    return FileLock(str(cache_dir.with_suffix(".lock")))


def prove_mitigations(venv: Venv, cache_dir: Path, torch_version: str, lock: FileLock | None = None) -> dict | None:
    """Run the trainer's hazard self-tests in the venv unless it has a record for this torch and trainer
    source; returns the new record (None when the existing one is current)."""
    digest = trainer_digest()
    if selftest.is_current(venv, torch_version, digest):
        return None
    return selftest.prove(venv, cache_dir, lock or warm_lock(cache_dir), digest)


def run_selftests(venv: Venv, preset: str | None = None, config: str | None = None) -> dict:
    """The hazard self-tests alone, in the environment the run's warm-up would have; recorded in the venv."""
    parts = key_parts(venv, preset, config)
    cache_dir = compile_root() / env_key(parts)
    ensure_private_dir(cache_dir)
    return selftest.prove(venv, cache_dir, warm_lock(cache_dir), trainer_digest())


def verify(venv: Venv, preset: str | None = None, config: str | None = None,
           described: dict | None = None) -> Verification:
    parts = key_parts(venv, preset, config, described)
    key = env_key(parts)
    cache_dir = compile_root() / key
    fingerprint = read_fingerprint(cache_dir)
    if fingerprint is None:
        return Verification(str(cache_dir), key, False, key_differs=_closest_key_difference(parts, venv))
    return compare(cache_dir, fingerprint)


def _closest_key_difference(parts: dict, venv: Venv) -> dict:
    """For a cold cache: which key parts differ from a cache this venv warmed before (why it is cold)."""
    for _cache_dir, fingerprint in fingerprints():
        if fingerprint and fingerprint.get("venv") == str(venv.path):
            old = fingerprint.get("key_parts", {})
            return {k: [old.get(k), v] for k, v in parts.items() if old.get(k) != v}
    return {}


