"""`envkit run -- COMMAND`: envkit's guarantees for any training command, not only the bundled trainer.

The same preflight as `envkit train` (venv, doctor, the hazard self-tests where torch is installed), then
COMMAND with the venv activated and a private compile cache keyed by the venv and the user's code, in a run
dir with run.json and train.log, supervised like a training run. The cache is fingerprinted when the command
finishes and verified before the next run starts, so a later run hits what this one compiled and tampering
in between stops it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from envkit.cache.fingerprint import compare, read_fingerprint, tampered_names
from envkit.cache.key import compile_root, ensure_private_dir, env_key
from envkit.errors import RunError
from envkit.venv.installed import installed_versions
from envkit.run.preflight import (new_run_dir, note_cache_overrides, preflight_doctor, preflight_venv,
                                  prove_mitigations, versions)
from envkit.run.rundir import LOG, RUN_JSON, boot_id, end_recorded_if_unsupervised, now
from envkit.run.supervise import detach, supervise
from envkit.support.fsops import write_json_atomic
from envkit.support.progress import Phases
from envkit.support.text import printable
from envkit.venv.managed import Venv

UNTRACKED_HASH_LIMIT = 4 << 20  # bigger untracked files (data, checkpoints) count by path and size only
SOURCE_FILES_LIMIT = 20_000


@dataclass(frozen=True)
class CommandRequest:
    command: tuple[str, ...]
    venv_path: str | None = None
    profile_name: str | None = None
    name: str | None = None
    runs_dir: str | None = None
    detach: bool = False
    allow_warn: bool = False
    code_dir: str | None = None  # default: the working directory
    env: dict = field(default_factory=dict)  # what the command is told besides (Slurm placement)


def _git(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, timeout=60)


def _hash_file(digest, path: Path, relative: str) -> None:
    """A file's path, size and bytes; a symlink by its target text and by what it points at (an edit to the
    target is an edit to the code), a directory it points at by its *.py files."""
    try:
        if path.is_symlink():
            digest.update(f"{relative}\0link\0{os.readlink(path)}\0".encode())
            if path.is_dir():
                _hash_python_files(digest, path.resolve(), relative)
                return
        info = path.stat()
        digest.update(f"{relative}\0{info.st_size}\0".encode())
        if path.is_file() and info.st_size <= UNTRACKED_HASH_LIMIT:
            digest.update(path.read_bytes())
    except OSError:
        digest.update(f"{relative}\0unreadable\0".encode())


def _hash_python_files(digest, root: Path, label: str, skip: tuple[Path, ...] = ()) -> None:
    """Every *.py file under `root` (not hidden dirs, venvs or byte code), at most SOURCE_FILES_LIMIT of them."""
    count = 0
    for directory, dirs, names in os.walk(root):
        here = Path(directory)
        # Not code: hidden dirs, venvs, byte code and envkit's own outputs (runs dirs).
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                         and not (here / d / "pyvenv.cfg").exists() and (here / d).resolve() not in skip)
        for name in sorted(n for n in names if n.endswith(".py")):
            count += 1
            if count > SOURCE_FILES_LIMIT:
                raise RunError(f"{printable(root)} holds over {SOURCE_FILES_LIMIT} Python files and is not a git "
                               f"repository; give --code the directory of your training code")
            relative = str((here / name).relative_to(root))
            _hash_file(digest, here / name, f"{label}/{relative}" if label else relative)


def _submodules(code_dir: Path) -> list[str]:
    """Paths of the git submodules under `code_dir` (gitlinks in the index), relative to it."""
    staged = _git(code_dir, "ls-files", "--stage", "-z", "--", ".").stdout.decode(errors="surrogateescape")
    return sorted(entry.split("\t", 1)[1] for entry in staged.split("\0") if entry.startswith("160000 "))


def _git_identity(code_dir: Path, skip: tuple[Path, ...], depth: int = 0) -> tuple[str, str]:
    """(HEAD, digest of what is not committed) of a git work tree: the diff against HEAD, untracked files, and each
    submodule by its own commit and its own uncommitted changes (the parent's diff shows only "-dirty")."""
    commit = _git(code_dir, "rev-parse", "HEAD").stdout.decode().strip()
    digest = hashlib.sha256(_git(code_dir, "diff", "HEAD", "--binary", "--", ".").stdout)
    untracked = _git(code_dir, "ls-files", "--others", "--exclude-standard", "-z", "--", ".").stdout
    for relative in sorted(filter(None, untracked.decode(errors="surrogateescape").split("\0"))):
        path = code_dir / relative
        if not any(path.resolve().is_relative_to(p) for p in skip):
            _hash_file(digest, path, relative)
    for relative in _submodules(code_dir) if depth < 8 else ():
        sub = code_dir / relative
        if (sub / ".git").exists() and _git(sub, "rev-parse", "HEAD").returncode == 0:
            sub_commit, sub_changes = _git_identity(sub, skip, depth + 1)
            if sub_changes != hashlib.sha256().hexdigest():
                digest.update(f"submodule\0{relative}\0{sub_commit}\0{sub_changes}\0".encode())
    return commit, digest.hexdigest()


def code_identity(code_dir: Path, skip: tuple[Path, ...] = ()) -> dict:
    """The user's code as a cache key part: the git commit plus a digest of what is not committed (the diff
    against HEAD, untracked, not-ignored files, submodules' own changes), or outside git a digest of every *.py
    file under the dir. Symlinks count by what they point at."""
    code_dir = code_dir.resolve()
    skip = tuple(p.resolve() for p in skip)
    if _git(code_dir, "rev-parse", "HEAD").returncode == 0:
        commit, changes = _git_identity(code_dir, skip)
        clean = changes == hashlib.sha256().hexdigest()
        return {"dir": str(code_dir), "commit": commit, "uncommitted": None if clean else changes[:16],
                "key": commit[:16] + ("" if clean else "+" + changes[:16])}
    digest = hashlib.sha256()
    _hash_python_files(digest, code_dir, "", skip)
    return {"dir": str(code_dir), "commit": None, "uncommitted": None, "key": "files:" + digest.hexdigest()[:16]}


def resolve_executable(command: tuple[str, ...], venv: Venv) -> list[str]:
    """COMMAND with its program found as the shell would with the venv activated; one line when it is not."""
    if not command:
        raise RunError("no command given: `envkit run [OPTIONS] -- COMMAND [ARGS...]`")
    search = os.pathsep.join([str(venv.path / "bin"), os.environ.get("PATH", os.defpath)])
    found = shutil.which(command[0], path=search)
    if found is None:
        raise RunError(f"command not found: {printable(command[0])!r} (looked in {venv.path / 'bin'} and PATH); "
                       f"nothing was started")
    return [os.path.abspath(found) if os.sep in command[0] else found, *command[1:]]


def _cache_for(venv: Venv, installed: dict, code: dict, phases: Phases) -> tuple[Path, dict, str | None]:
    """The command's private cache, verified against its fingerprint when an earlier run left one."""
    manifest = venv.manifest() or {}
    parts = {"kind": "command", "venv": str(venv.path), "lock_digest": manifest.get("lock_digest"),
             "python": venv.python_version(), "torch": installed.get("torch"), "triton": installed.get("triton"),
             "code": code["key"]}
    cache_dir = compile_root() / env_key(parts)
    with phases.phase("cache", f"env key {cache_dir.name} (code {code['key']})"):
        ensure_private_dir(cache_dir)
        fingerprint = read_fingerprint(cache_dir)
        if fingerprint is not None:
            result = compare(cache_dir, fingerprint)
            if result.tampered:
                raise RunError(f"the compile cache {cache_dir} changed since its last run fingerprinted it "
                               f"({tampered_names(result)}); remove it (`rm -rf {shlex.quote(str(cache_dir))}`) and run again")
    return cache_dir, parts, fingerprint["digest"] if fingerprint else None


def start_command(request: CommandRequest, *, quiet: bool = False) -> dict:
    """Preflight, then run (or detach) COMMAND in a new run dir; returns the final run.json."""
    phases = Phases(total=5, quiet=quiet)
    what = Path(request.command[0]).name
    if request.name:  # before preflight, not after
        new_run_dir(request.name, request.runs_dir, what)
    venv = preflight_venv(request.venv_path, request.profile_name, phases)
    command = resolve_executable(request.command, venv)
    profile = preflight_doctor(venv, request.profile_name, request.allow_warn, phases)
    run_dir = new_run_dir(request.name, request.runs_dir, what)
    code_dir = Path(request.code_dir or os.getcwd())
    if not code_dir.is_dir():
        raise RunError(f"--code {printable(code_dir)}: not a directory; give the directory of your training code")
    code = code_identity(code_dir, skip=(run_dir.parent,))
    installed = installed_versions(venv.site_packages())
    cache_dir, parts, fingerprint = _cache_for(venv, installed, code, phases)
    if installed.get("torch"):
        prove_mitigations(venv, cache_dir, installed["torch"], phases)
    try:
        run_dir.mkdir(parents=True)
    except OSError as exc:
        raise RunError(f"cannot create the run dir {run_dir}: {exc.strerror}; give --runs-dir a writable dir") from None
    write_json_atomic(run_dir / RUN_JSON, {
        "name": run_dir.name, "kind": "command", "status": "starting", "command": command, "cwd": os.getcwd(),
        "env": request.env, "profile": profile.name if profile else None,
        "lock_digest": profile.lock_digest if profile else None, "venv": str(venv.path), "versions": versions(venv),
        "code": code, "git_commit": code["commit"], "env_key": cache_dir.name, "cache_dir": str(cache_dir),
        "key_parts": parts, "cache_fingerprint": fingerprint, "envkit_command": sys.argv,
        "env_overridden": note_cache_overrides(cache_dir, phases),
        "host": socket.gethostname(), "boot_id": boot_id(), "started_at": now(), "ended_at": None, "exit_code": None,
        "detached": request.detach, "launcher_pid": os.getpid(), "preflight_s": phases.timings})
    with end_recorded_if_unsupervised(run_dir):
        if request.detach:
            return detach(run_dir, phases, "[5/5] run")
        phases.say(f"[5/5] run: {printable(' '.join(request.command))} in {run_dir} (log: {run_dir / LOG})")
        return supervise(run_dir, echo=not quiet) | {"run_dir": str(run_dir)}


def describe_command_run(record: dict) -> str:
    line = (f"run {record.get('name')}: {record.get('status')} (exit {record.get('exit_code')}); "
            f"run dir {record.get('run_dir')}")
    if record.get("status") == "failed" and record.get("error"):
        line += f"\n  {record['error']}"
    return printable(line, keep_newlines=True)

