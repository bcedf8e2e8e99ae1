"""The managed compile cache: private location, env key, warm-up, fingerprint and verification.

Layout: <cache root>/compile/<env key>/{inductor,triton,fingerprint.json}, dirs 0700, plus a
sibling `<env key>.lock` that serialises warmers (HAZARDS.md H5, H6).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from envkit import paths, selftest
from envkit.cachetrust import permission_problem, read_json_file, tree_problems
from envkit.children import die_with_parent
from envkit.doctor.findings import Finding, Status
from envkit.errors import CacheError
from envkit.installed import installed_versions
from envkit.trainer_process import run_trainer, trainer_args, trainer_command, trainer_env, trainer_failure
from envkit.trainer_source import trainer_digest
from envkit.text import printable
from envkit.venv import Venv, write_json_atomic

FINGERPRINT = "fingerprint.json"
CACHE_SUBDIRS = ("inductor", "triton")


# -- env key -------------------------------------------------------------------------------------
def describe(venv: Venv, preset: str | None, config: str | None, extra_args: tuple[str, ...] = ()) -> dict:
    """The trainer's own account of versions, device and the resolved config (preset or file, then the
    trainer's own flags), from the venv's interpreter."""
    return json.loads(run_trainer(venv, ["describe", *trainer_args(preset, config), *extra_args],
                                  trainer_env(venv, None), timeout=300).stdout)


def key_parts(venv: Venv, preset: str | None, config: str | None, described: dict | None = None) -> dict:
    """What decides whether compiled artifacts can be reused."""
    described = described or describe(venv, preset, config)
    config_digest = hashlib.sha256(json.dumps(described["config"], sort_keys=True).encode()).hexdigest()[:16]
    return {"torch": described["torch"], "cuda": described["cuda"], "triton": described["triton"],
            "python": described["python"], "device": described["device"], "trainer": trainer_digest(),
            "preset": described["preset"], "config": config_digest}


def env_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def compile_root() -> Path:
    return paths.cache_root() / "compile"


def ensure_private_dir(path: Path) -> None:
    """Create `path` (and the compile root) 0700; refuse one with any entry others own or can write, or a link."""
    try:
        for directory in (compile_root(), path, *(path / sub for sub in CACHE_SUBDIRS)):
            if not directory.is_symlink():
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if directory == compile_root():
                # The root may be a link the user made (a cache on another disk); what is under it may not.
                problem = permission_problem(directory.resolve())
                if problem:
                    raise CacheError(f"compile cache dir {directory} is {problem}; fix with `chmod -R go-rwx "
                                     f"{directory}` (if it is yours) or set ENVKIT_CACHE_DIR to a private dir")
        problems = tree_problems(path)
        if problems:
            raise CacheError(untrusted_message(path, problems))
    except OSError as exc:
        raise CacheError(f"cannot create the compile cache at {path}: {exc.strerror}; set ENVKIT_CACHE_DIR to a "
                         f"writable dir") from None


def untrusted_message(cache_dir: Path, problems: dict[str, str]) -> str:
    named = "; ".join(f"{name}: {why}" for name, why in list(problems.items())[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return (f"compile cache {cache_dir} cannot be trusted: {named}{more}; if every file is yours, "
            f"`chmod -R go-w {cache_dir}` and remove the links, else `rm -rf {cache_dir}` and run `envkit warm-cache`")


# -- fingerprint ---------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def scan(cache_dir: Path) -> dict[str, tuple[int, str]]:
    """{relative path: (size, sha256)} of every regular file under inductor/ and triton/ (links not followed)."""
    files = {}
    for sub in CACHE_SUBDIRS:
        root = cache_dir / sub
        if root.is_symlink():
            continue  # reported by tree_problems; never followed
        for directory, _dirs, names in os.walk(root, followlinks=False):
            for name in names:
                path = Path(directory) / name
                if path.is_file() and not path.is_symlink():
                    files[str(path.relative_to(cache_dir))] = (path.lstat().st_size, file_sha256(path))
    return dict(sorted(files.items()))


def files_digest(files: dict[str, tuple[int, str]]) -> str:
    canonical = json.dumps(sorted([p, s, h] for p, (s, h) in files.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def read_fingerprint(cache_dir: Path) -> dict | None:
    path = cache_dir / FINGERPRINT
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = read_json_file(path)
        if not isinstance(data, dict) or not isinstance(data.get("files"), list) or "digest" not in data:
            raise ValueError("missing files or digest")
        if not all(isinstance(row, list) and len(row) == 3 for row in data["files"]):
            raise ValueError("malformed files table")
        return data
    except (OSError, ValueError) as exc:
        raise CacheError(f"{path} is corrupted ({exc}); its cache cannot be trusted: remove {cache_dir} and run "
                         f"`envkit warm-cache` again") from None


@dataclass(frozen=True)
class Verification:
    cache_dir: str
    env_key: str
    fingerprinted: bool
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()  # growth: new entries torch wrote since, not a trust problem
    key_differs: dict = field(default_factory=dict)  # part -> [fingerprinted, now]
    # Entries torch could load that no fingerprint can vouch for: links, FIFOs, others' or writable files.
    untrusted: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (self.fingerprinted and not self.removed and not self.changed and not self.key_differs
                and not self.untrusted)

    @property
    def tampered(self) -> bool:
        return bool(self.removed or self.changed or self.untrusted)


def compare(cache_dir: Path, fingerprint: dict) -> Verification:
    recorded = {p: (s, h) for p, s, h in fingerprint["files"]}
    untrusted = tree_problems(cache_dir)
    current = scan(cache_dir) if "." not in untrusted else {}
    return Verification(
        str(cache_dir), fingerprint.get("env_key", cache_dir.name), True,
        removed=tuple(sorted(set(recorded) - set(current))),
        changed=tuple(sorted(p for p in set(recorded) & set(current) if recorded[p] != current[p])),
        added=tuple(sorted(set(current) - set(recorded))), untrusted=untrusted)


def write_fingerprint(cache_dir: Path, parts: dict, buckets: list[int], counters: dict, venv: Venv,
                      key: str | None = None) -> dict:
    """Fingerprint what is in cache_dir now (its env key is its name unless it is staged under another)."""
    problems = tree_problems(cache_dir)
    if problems:  # never vouch for what cannot be verified
        raise CacheError(untrusted_message(cache_dir, problems))
    files = scan(cache_dir)
    manifest = venv.manifest() or {}
    fingerprint = {
        "env_key": key or cache_dir.name, "key_parts": parts, "buckets": buckets, "counters": counters,
        "venv": str(venv.path), "lock_digest": manifest.get("lock_digest"),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": [[p, s, h] for p, (s, h) in sorted(files.items())], "digest": files_digest(files),
    }
    write_json_atomic(cache_dir / FINGERPRINT, fingerprint)
    return fingerprint


# -- warm-up -------------------------------------------------------------------------------------
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
        named = ", ".join((result.changed + result.removed + tuple(result.untrusted))[:3])
        raise CacheError(f"{cache_dir} changed since it was fingerprinted ({named}); it cannot be trusted: "
                         f"remove it (`rm -rf {cache_dir}`) and run `envkit warm-cache` again")


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


def _fingerprints() -> list[tuple[Path, dict | None]]:
    found = []
    for path in sorted(compile_root().glob(f"*/{FINGERPRINT}")):
        try:
            found.append((path.parent, read_fingerprint(path.parent)))
        except CacheError:
            found.append((path.parent, None))
    return found


def _mentions(path: Path, text: str) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes()[: 64 << 20]
    except OSError:
        return False


def _closest_key_difference(parts: dict, venv: Venv) -> dict:
    """For a cold cache: which key parts differ from a cache this venv warmed before (why it is cold)."""
    for _cache_dir, fingerprint in _fingerprints():
        if fingerprint and fingerprint.get("venv") == str(venv.path):
            old = fingerprint.get("key_parts", {})
            return {k: [old.get(k), v] for k, v in parts.items() if old.get(k) != v}
    return {}


# -- doctor --------------------------------------------------------------------------------------
def doctor_findings(venv: Venv) -> list[Finding]:
    """cache.fingerprint, read from outside (no torch import): fingerprints this venv made, re-hashed."""
    fix = f"envkit warm-cache --venv {shlex.quote(str(venv.path))}"
    # A corrupted fingerprint names no venv for sure: it is this venv's only if its bytes name this venv
    # (an unrelated broken cache must not fail every venv's doctor; `envkit cache ls` shows it).
    mine = [(d, f) for d, f in _fingerprints()
            if (f is None and _mentions(d / FINGERPRINT, str(venv.path))) or (f and f.get("venv") == str(venv.path))]
    if not mine:
        return [Finding("cache.fingerprint", Status.WARN, str(compile_root()),
                        "no fingerprinted compile cache for this venv: the first steps of every bucket compile cold",
                        fix)]
    findings = []
    installed = installed_versions(venv.site_packages())
    now = {"torch": installed.get("torch"), "triton": installed.get("triton"),
           "python": venv.python_version(), "trainer": trainer_digest()}
    for cache_dir, fingerprint in mine:
        if fingerprint is None:
            findings.append(Finding("cache.fingerprint", Status.FAIL, str(cache_dir),
                                    f"{FINGERPRINT} is corrupted: this cache cannot be trusted",
                                    f"rm -rf {cache_dir} && {fix}"))
            continue
        result = compare(cache_dir, fingerprint)
        if result.tampered:
            named = ", ".join(result.changed[:2] + result.removed[:2] + tuple(result.untrusted)[:2])
            findings.append(Finding("cache.fingerprint", Status.FAIL, str(cache_dir),
                                    f"{len(result.changed)} changed, {len(result.removed)} removed and "
                                    f"{len(result.untrusted)} unverifiable entries since fingerprinted ({named}): "
                                    f"corruption or tampering", f"rm -rf {cache_dir} && {fix}"))
            continue
        old = fingerprint.get("key_parts", {})
        stale = {k: (old.get(k), v) for k, v in now.items() if k in old and old.get(k) != v}
        if stale:
            what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in stale.items())
            findings.append(Finding("cache.fingerprint", Status.WARN, str(cache_dir),
                                    f"stale for this venv ({what}): training would compile cold", fix))
            continue
        growth = f", {len(result.added)} files added since (growth)" if result.added else ""
        findings.append(Finding("cache.fingerprint", Status.OK, str(cache_dir),
                                f"preset {old.get('preset')}: {len(fingerprint['files'])} files match their "
                                f"fingerprint{growth}"))
    return findings


# -- ls / prune ----------------------------------------------------------------------------------
def _tree_size(root: Path) -> int:
    """Bytes of the regular files under root, links neither followed nor counted."""
    if root.is_symlink():
        return 0
    return sum(entry.stat(follow_symlinks=False).st_size for directory, _d, names in os.walk(root)
               for entry in (Path(directory) / name for name in names) if entry.is_file() and not entry.is_symlink())


def list_caches() -> list[dict]:
    rows = []
    for cache_dir in sorted(p for p in compile_root().glob("*") if p.is_dir()):
        try:
            fingerprint = read_fingerprint(cache_dir)
        except CacheError:
            fingerprint = {"corrupted": True}
        size = _tree_size(cache_dir)
        fingerprint = fingerprint or {}
        rows.append({"env_key": cache_dir.name, "path": str(cache_dir), "bytes": size,
                     "preset": fingerprint.get("key_parts", {}).get("preset"), "venv": fingerprint.get("venv"),
                     "buckets": fingerprint.get("buckets"), "created_at": fingerprint.get("created_at"),
                     "fingerprinted": "digest" in fingerprint, "corrupted": fingerprint.get("corrupted", False)})
    return rows


def prune(*, dry_run: bool = False) -> list[dict]:
    """Remove caches of env keys no venv uses any more: their venv is gone or its torch/python changed."""
    removed = []
    for row in list_caches():
        venv_path = row["venv"]
        reason = None
        if not row["fingerprinted"]:
            continue  # an interrupted warm-up continues from it; a corrupted one is doctor's to report
        if not venv_path or not Venv(Path(venv_path)).is_venv():
            reason = f"venv {venv_path} is gone"
        else:
            fingerprint = read_fingerprint(Path(row["path"]))
            venv = Venv(Path(venv_path))
            old = fingerprint["key_parts"]
            if old.get("torch") != installed_versions(venv.site_packages()).get("torch") or \
                    old.get("python") != venv.python_version():
                reason = f"venv {venv_path} now has another torch or python"
        if reason:
            if not dry_run:
                shutil.rmtree(row["path"], ignore_errors=True)
                Path(row["path"]).with_suffix(".lock").unlink(missing_ok=True)
            removed.append({**row, "reason": reason})
    return removed
