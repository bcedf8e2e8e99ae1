"""`envkit create`: build a venv from a lock profile into a temp sibling, then rename it into place."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from envkit import __version__, paths
from envkit.venv import record as venvrecord
from envkit.errors import VenvError
from envkit.venv.installed import installed_versions
from envkit.lock import profile as profiles
from envkit.lock import wheelhouse
from envkit.lock.profile import Profile
from envkit.lock.resolve import source_args
from envkit.lock.uvtool import run_uv, uv_version
from envkit.support.fsops import exchange
from envkit.support.fsops import write_json_atomic
from envkit.support.progress import Phases
from envkit.venv.managed import Venv


@dataclass(frozen=True)
class CreateResult:
    venv: Path
    profile: str
    lock_digest: str
    action: str  # "created", "rebuilt" or "unchanged"
    packages: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)


def lock_file_for(venv_path: Path) -> Path:
    return venv_path.parent / f".{venv_path.name}.lock"


def _temp_prefix(venv_path: Path) -> str:
    return f".{venv_path.name}.tmp-"


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM unwinds like Ctrl-C so that the temp dir is removed (SIGKILL is cleaned next time)."""
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


TEMP_MARKER = "envkit-create-temp"  # written into every temp dir create makes, before anything else


def _our_temp(path: Path) -> bool:
    """A temp dir of an earlier create: a real directory holding create's marker and nothing but its venv."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        return (path / TEMP_MARKER).is_file() and {p.name for p in path.iterdir()} <= {TEMP_MARKER, "venv"}
    except OSError:
        return False


def _our_venv(path: Path) -> bool:
    """A venv envkit made (its envkit.json manifest is there and reads as one), not a link."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        return Venv(path).is_venv() and Venv(path).manifest() is not None
    except VenvError:
        return False


def _recover_interrupted(venv_path: Path) -> None:
    """Clean up after a create that was killed outright; safe because we hold the venv's lock.

    Only what create made is touched: a temp dir holding its marker is removed; a moved-aside venv
    (`.NAME.old-*` with envkit's manifest) is put back when nothing took its place (killed between the
    two renames of a swap without renameat2), and removed only once a venv stands at the path. A
    sibling that merely has such a name is left alone.
    """
    for stale in venv_path.parent.glob(_temp_prefix(venv_path) + "*"):
        if _our_temp(stale):
            shutil.rmtree(stale, ignore_errors=True)
    for old in sorted(venv_path.parent.glob(f".{venv_path.name}.old-*")):
        if not _our_venv(old):
            continue
        if not venv_path.exists() and not venv_path.is_symlink():
            os.rename(old, venv_path)
        else:
            shutil.rmtree(old, ignore_errors=True)


def is_current(venv: Venv, profile: Profile) -> bool:
    """The venv was made by envkit from this exact lock and still holds exactly the locked versions."""
    manifest = venv.manifest()
    if not venv.is_venv() or not manifest or manifest.get("lock_digest") != profile.lock_digest:
        return False
    return installed_versions(venv.site_packages()) == {p.name: p.version for p in profile.packages}


def manifest_for(profile: Profile, python_version: str) -> dict:
    return {
        "profile": profile.name,
        "lock_path": str(profile.path.resolve()) if profile.path else None,
        "lock_digest": profile.lock_digest,
        "python": python_version,
        "envkit_version": __version__,
        "uv_version": uv_version(),
        "platform": platform.platform(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def sync(venv: Venv, profile: Profile, links: list[str], *, offline: bool, no_index: bool,
         reinstall: list[str] | tuple[str, ...] = ()) -> None:
    """Make the venv hold exactly the lock: `uv pip sync --require-hashes` (also used by doctor --fix)."""
    profile.check_complete()
    with tempfile.NamedTemporaryFile("w", prefix="envkit-sync-", suffix=".txt") as reqs:
        reqs.write(profile.requirements_txt())
        reqs.flush()
        # --compile-bytecode: every module's .pyc is written here, once. Without it a process that imports torch
        # compiles ~1,800 modules from source on every start wherever PYTHONDONTWRITEBYTECODE is set (or
        # site-packages is read-only): ~7 s of each warm-up, self-test and training process on 2 cores.
        run_uv(["pip", "sync", reqs.name, "--require-hashes", "--compile-bytecode", "--python", str(venv.python),
                "--quiet",
                *source_args(profile, links, offline=offline, no_index=no_index),
                *(arg for name in reinstall for arg in ("--reinstall-package", name))])


def _build(temp: Venv, profile: Profile, links: list[str], phases: Phases, *, offline: bool, no_index: bool) -> None:
    with phases.phase("venv", f"python {profile.python}"):
        # --relocatable: scripts find their interpreter relative to themselves, so the rename
        # from the temp dir into place does not break `bin/torchrun` and friends.
        run_uv(["venv", str(temp.path), "--python", profile.python, "--relocatable", "--quiet", "--no-project",
                *(["--offline"] if offline else [])])
    sources = ", ".join(links) if links else "the configured index"
    with phases.phase("install", f"{len(profile.packages)} packages, hash-checked, from {sources}"):
        sync(temp, profile, links, offline=offline, no_index=no_index)
    with phases.phase("verify", "installed set equals the lock"):
        installed = installed_versions(temp.site_packages())
        wanted = {p.name: p.version for p in profile.packages}
        if installed != wanted:
            diff = sorted(set(installed.items()) ^ set(wanted.items()))
            raise VenvError(f"uv installed a set that differs from the lock: {diff[:5]}; report this with the lock file")


def _swap_into_place(temp: Path, target: Path) -> None:
    """Put the finished venv at `target`; at no moment is the path without a venv.

    With an old venv there, the two are exchanged in one renameat2(RENAME_EXCHANGE) and the old one,
    now at the temp name, is removed. Where the kernel or filesystem lacks that, the old venv is
    renamed aside first; a kill between the two renames is undone by the next create.
    """
    if not (target.exists() or target.is_symlink()):
        os.rename(temp, target)
        return
    if exchange(temp, target):
        shutil.rmtree(temp, ignore_errors=True)
        return
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(target, old)
    try:
        os.rename(temp, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _check_replaceable(venv: Venv) -> None:
    """create replaces only what it made: an envkit venv, or an empty directory. Never a user's files."""
    path = venv.path
    if path.is_symlink():
        raise VenvError(f"{path} is a symlink; envkit does not replace links: give the real path with --venv")
    if not path.is_dir():
        raise VenvError(f"{path} exists and is not a directory; choose another --venv")
    if not any(path.iterdir()):
        return
    if not venv.is_venv():
        raise VenvError(f"{path} exists, is not empty and is not a venv; envkit will not delete it, even with "
                        f"--force: choose another --venv or move it away yourself")
    if venv.manifest() is None:
        raise VenvError(f"{path} is a venv that envkit did not make (no {venv.manifest_path.name}); envkit will not "
                        f"delete it, even with --force: choose another --venv or remove it yourself")


def create(profile_name: str | None = None, lock_path: str | None = None, venv_path: str | Path | None = None, *,
           find_links: tuple[str, ...] = (), offline: bool = False, no_index: bool = False, force: bool = False,
           quiet: bool = False) -> CreateResult:
    profile = profiles.load(profile_name, lock_path)
    if not profile.packages:
        raise VenvError(f"{profile.path} has no [[package]] table; run `envkit lock --lock {profile.path}` first")
    profile.check_complete()
    target = Path(venv_path) if venv_path else paths.default_venv(profile.name)
    target = target.expanduser().absolute()
    if target.parent == target or target == Path.home():
        raise VenvError(f"{target} cannot be a venv path (it would replace a whole tree); give --venv a dedicated dir")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_file_for(target)))
        with lock:  # probe: an unwritable place fails here, with a message, not as a traceback below
            pass
    except OSError as exc:
        blocking = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocking} is a file, not a directory" if blocking else f"{exc.strerror} at {exc.filename or target.parent}"
        raise VenvError(f"cannot create {target}: {why}; give --venv (or ENVKIT_HOME) a writable place") from None
    venv = Venv(target)
    phases = Phases(total=4, quiet=quiet)
    if profile.left_out:
        phases.say(f"note: {profile.path.name} names local packages no index serves, not installed: "
                   f"{', '.join(profile.left_out)} (install them into the venv yourself, e.g. `uv pip install -e .`)")

    with lock, _sigterm_as_interrupt():
        _recover_interrupted(target)
        existed = target.exists() or target.is_symlink()
        if existed:
            _check_replaceable(venv)
            if not force and is_current(venv, profile):
                phases.say(f"{target} already matches lock {profile.lock_digest[:12]}; nothing to do (--force rebuilds)")
                return CreateResult(target, profile.name, profile.lock_digest, "unchanged", len(profile.packages),
                                    round(phases.elapsed, 3))
        links = wheelhouse.find_links(find_links)
        scratch = Path(tempfile.mkdtemp(prefix=_temp_prefix(target), dir=target.parent))
        try:
            (scratch / TEMP_MARKER).write_text(f"pid {os.getpid()}\n")  # a later create may remove it, nothing else
            temp = Venv(scratch / "venv")  # uv venv makes the directory itself
            _build(temp, profile, links, phases, offline=offline, no_index=no_index)
            with phases.phase("done", str(target)):
                write_json_atomic(temp.manifest_path, manifest_for(profile, temp.python_version()))
                _swap_into_place(temp.path, target)
                venvrecord.remember(venv, profile)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return CreateResult(target, profile.name, profile.lock_digest, "rebuilt" if existed else "created",
                        len(profile.packages), round(phases.elapsed, 3), phases.timings)
