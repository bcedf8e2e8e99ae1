"""envkit's own records about what it inspects, kept where the inspected thing cannot write.

A venv, a built target or a run dir may be handed over by someone else, so nothing it says about
itself is proof: the lock a venv was created from, the self-tests that passed in it, the digests a
target was built with all live here, under the cache root (`ENVKIT_CACHE_DIR/state/KIND/KEY.json`).
A record counts only when it and every directory above it up to the cache root are owned by the
user and writable by no one else (the rule the compile cache follows); otherwise it is ignored with
a warning on stderr, never believed.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from envkit import paths
from envkit.support.trust import permission_problem
from envkit.support.fsops import write_json_atomic
from envkit.support.text import printable
from envkit.support.trainer_helpers import read_json_file

RECORD_LIMIT = 64 << 20


def state_dir() -> Path:
    return paths.cache_root() / "state"


def record_path(kind: str, key: str) -> Path:
    return state_dir() / kind / f"{key}.json"


def path_key(path: Path) -> str:
    """A file-name-safe key for a path (its absolute, resolved form)."""
    return hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:32]


def untrusted_reason(path: Path) -> str | None:
    """Why `path` (a file of envkit's state or cache root) may have been written by someone else, or None."""
    root = paths.cache_root()
    chain = [path, *[parent for parent in path.parents if parent == root or root in parent.parents]]
    for entry in chain:
        try:
            problem = permission_problem(entry)
        except FileNotFoundError:
            return None  # nothing there: nothing to distrust
        except OSError as exc:
            return exc.strerror or str(exc)
        if problem:
            return f"{printable(entry)} is {problem}" if entry != path else problem
    return None


def warn_ignored(path: Path, reason: str) -> None:
    print(f"Warning: ignoring {printable(path)}: {reason}; envkit keeps its own records private "
          f"(remove it, or fix its owner and mode)", file=sys.stderr)


def read_trusted_json(path: Path, *, limit: int = RECORD_LIMIT):
    """JSON from one of envkit's own files, or None when absent, unreadable, or possibly not envkit's."""
    if not os.path.lexists(path):
        return None
    reason = untrusted_reason(path)
    if reason:
        warn_ignored(path, reason)
        return None
    try:
        return read_json_file(path, limit=limit)
    except ValueError:
        return None


def read(kind: str, key: str) -> dict | None:
    record = read_trusted_json(record_path(kind, key))
    return record if isinstance(record, dict) else None


def write(kind: str, key: str, record: dict) -> None:
    path = record_path(kind, key)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for directory in (state_dir(), path.parent):
        os.chmod(directory, 0o700)
    write_json_atomic(path, record, mode=0o600)
