"""A data file's sha256 without re-reading it: remembered per path with the file's stat, privately.

A store's key includes its source file's sha256, and hashing a 7.6 GB JSONL takes ~16 s on every start (every
rank, every run). The digest is reused only while the file's size, mtime, ctime, inode and device are those it
was computed with; ctime changes on any write and cannot be set back by a user, so an edit that restores size
and mtime still re-hashes. The memo lives under envkit's home, and is ignored when someone else could have
written it (owner or mode, as every record envkit keeps).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.common.files import atomic_write, file_sha256, permission_problem, read_json_record


def changed_while_read(path: Path) -> TrainerInputError:
    return TrainerInputError(f"data file {path} changed while it was read (written to or replaced); prepare it again "
                             f"once nothing writes it")


def file_identity(path: Path) -> dict:
    info = os.stat(path)
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns, "ino": info.st_ino,
            "dev": info.st_dev}


def _memo_path(memo_dir: Path, path: Path) -> Path:
    return memo_dir / (hashlib.sha256(str(path.absolute()).encode()).hexdigest()[:32] + ".json")


def _trusted(memo: Path) -> bool:
    try:
        return all(permission_problem(p) is None for p in (memo.parent, memo))
    except OSError:
        return False


def source_sha256(path: Path, memo_dir: Path) -> str:
    """The file's sha256, from the memo when the file is unchanged since, else computed and remembered. A file
    written to or replaced while it is hashed is refused: the digest would vouch for bytes no longer there."""
    identity = file_identity(path)
    memo = _memo_path(memo_dir, path)
    if memo.exists() and _trusted(memo):
        record = read_json_record(memo)
        if record and record.get("path") == str(path.absolute()) and record.get("stat") == identity:
            return str(record["sha256"])
    digest = file_sha256(path)
    if file_identity(path) != identity:
        raise changed_while_read(path)
    try:
        memo_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(memo, json.dumps({"path": str(path.absolute()), "stat": identity, "sha256": digest}), mode=0o600)
    except OSError:
        pass  # a memo is an optimisation: an unwritable home only costs the next start a re-hash
    return digest
