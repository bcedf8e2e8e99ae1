"""Which lock envkit created a venv from, and so its role (train or serve), recorded in envkit's own state (a venv's
envkit.json is its own word).

doctor, train and export use a venv's lock without `--profile/--lock` only when the user or envkit chose
it: a profile of this project, or the lock envkit recorded here when it built that very venv (same path,
same directory inode: a venv copied or rebuilt elsewhere is another venv).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from envkit.support import state
from envkit.errors import ProfileError
from envkit.lock import profile as profiles
from envkit.support.text import printable
from envkit.venv.managed import Venv

KIND = "venvs"


def _identity(venv: Venv) -> dict | None:
    try:
        info = os.stat(venv.path)
    except OSError:
        return None
    return {"path": str(venv.path.resolve()), "inode": info.st_ino, "device": info.st_dev}


def remember(venv: Venv, profile: profiles.Profile) -> None:
    """Record, after a create, the lock this venv was built from."""
    identity = _identity(venv)
    if identity is None:
        return
    record = {**identity, "profile": profile.name, "lock_digest": profile.lock_digest,
              "lock_path": str(profile.path.resolve()) if profile.path else None, "role": profile.role,
              "engine": profile.engine}
    try:
        state.write(KIND, state.path_key(venv.path), record)
    except OSError as exc:  # the venv is fine; only its lock must then be named on later commands
        state.warn_ignored(state.record_path(KIND, state.path_key(venv.path)), f"cannot be written ({exc.strerror})")


def _record(venv: Venv) -> dict | None:
    """envkit's record of creating this very venv (same path, same directory inode), or None."""
    record = state.read(KIND, state.path_key(venv.path))
    identity = _identity(venv)
    if not record or identity is None or any(record.get(k) != v for k, v in identity.items()):
        return None
    return record


def recorded_lock(venv: Venv) -> str | None:
    """The lock path envkit recorded creating this very venv from, or None."""
    lock_path = (_record(venv) or {}).get("lock_path")
    return lock_path if isinstance(lock_path, str) else None


@dataclass(frozen=True)
class Role:
    name: str  # "train" or "serve"
    engine: str | None  # a serve venv's engine
    profile: str | None  # the profile it was created from, for messages
    recorded: bool  # envkit's own record says so (else: the lock the user named, else the default, train)


def role_of(venv: Venv, profile: profiles.Profile | None = None) -> Role:
    """A venv's role: what envkit recorded creating it as, else the role of the lock the user named, else train.
    Nothing in the venv counts (a venv does not choose its own role)."""
    record = _record(venv)
    if record and record.get("role") in profiles.ROLES:
        engine = record.get("engine") if record.get("engine") in profiles.ENGINES else None
        return Role(record["role"], engine, record.get("profile"), True)
    if profile is not None:
        return Role(profile.role, profile.engine, profile.name, False)
    return Role("train", None, None, False)


def role_for(venv: Venv, profile_name: str | None = None, lock_path: str | None = None) -> Role:
    """The one derivation of a venv's role that every command uses (doctor, run, train, serve, warm-cache, prepare):
    envkit's record of creating it, else the role of the lock doctor checks it against (lock_for), else train."""
    try:
        profile = lock_for(venv, profile_name, lock_path).profile
    except ProfileError:
        profile = None
    return role_of(venv, profile)


@dataclass(frozen=True)
class LockChoice:
    profile: profiles.Profile | None
    refused: str = ""  # why the lock the venv names was not used (empty when none was refused)


def _project_profile(name) -> profiles.Profile | None:
    try:
        return profiles.load(profiles.check_profile_name(name, "envkit.json"))
    except ProfileError:
        return None


def lock_for(venv: Venv, profile_name: str | None, lock_path: str | None) -> LockChoice:
    """The lock given on the command line, else the one envkit recorded for this venv, else the project
    profile the venv's envkit.json names; a lock file the venv names itself is refused, with why."""
    if profile_name or lock_path:
        return LockChoice(profiles.load(profile_name, lock_path))
    recorded = recorded_lock(venv)
    if recorded and Path(recorded).is_file():
        return LockChoice(profiles.load_file(Path(recorded)))
    manifest = venv.manifest() or {}
    named_path, named_profile = manifest.get("lock_path"), manifest.get("profile")
    project = _project_profile(named_profile) if named_profile else None
    if project and (not named_path or Path(named_path).resolve() == project.path.resolve()):
        return LockChoice(project)
    if named_path:
        return LockChoice(None, f"its envkit.json names the lock {printable(named_path)}, which is not a profile of "
                                f"this project and not the lock envkit recorded creating this venv from: a venv does "
                                f"not choose its own lock (give --lock PATH if you trust that file)")
    return LockChoice(project)
