"""doctor's stat index: files whose content was verified, and the stat they had then (as git's index).

A file is hashed again when its size, mtime_ns, ctime_ns or inode changed. An edit in place changes
ctime, which no user can set back (utime changes it too), so a restored mtime does not hide an edit;
an edit through a hard link (uv's cache) changes the shared inode's ctime as well. The same rule
covers each RECORD: one whose stat is unchanged is not parsed again, its checked rows come from the
index (every file they list is still lstat'ed). The index is envkit's own (under ENVKIT_CACHE_DIR,
0600, read without following links, ignored with a warning unless it and its dirs are yours and writable by
no one else: envkit/support/state.py) and counts for nothing once the venv's lock digest changed.
`--deep` ignores it and hashes everything.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from envkit import paths
from envkit.support.state import read_trusted_json
from envkit.support.fsops import write_json_atomic
from envkit.venv.managed import Venv

VERSION = 2


@dataclass
class StatIndex:
    # path relative to site-packages -> [size, mtime_ns, ctime_ns, inode, RECORD digest], verified earlier
    files: dict[str, list] = field(default_factory=dict)
    # dist-info name -> {"stat": the RECORD's stat key, "rows": [[relative, digest], ...] it lists to check,
    # "pth": the top-level .pth files it lists}
    records: dict[str, dict] = field(default_factory=dict)


def stat_key(info: os.stat_result) -> list[int]:
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def current_stat_key(path: str) -> list[int] | None:
    """The stat key of a regular file (not followed if a link), else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return stat_key(info) if stat.S_ISREG(info.st_mode) else None


def index_path(venv: Venv) -> Path:
    venv_id = hashlib.sha256(str(venv.path.resolve()).encode()).hexdigest()[:16]
    return paths.cache_root() / "doctor" / f"{venv_id}.json"


def _lock_digest(venv: Venv) -> str | None:
    try:
        return (venv.manifest() or {}).get("lock_digest")
    except Exception:  # a damaged manifest is another check's finding; here it only means "no index"
        return None


def load(venv: Venv) -> StatIndex:
    """What an earlier run verified, or an empty index when there is none for this venv and lock."""
    # Owned by you and writable by no one else, or ignored: whoever writes the index decides which edits doctor skips.
    data = read_trusted_json(index_path(venv), limit=256 << 20)
    if not (isinstance(data, dict) and data.get("version") == VERSION and data.get("venv") == str(venv.path)
            and data.get("lock_digest") == _lock_digest(venv) and isinstance(data.get("files"), dict)
            and isinstance(data.get("records"), dict)):
        return StatIndex()
    return StatIndex(data["files"], data["records"])


def save(venv: Venv, index: StatIndex) -> None:
    path = index_path(venv)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_json_atomic(path, {"version": VERSION, "venv": str(venv.path), "lock_digest": _lock_digest(venv),
                                 "files": index.files, "records": index.records}, mode=0o600)
    except OSError:
        pass  # an index that cannot be written costs speed, never correctness
