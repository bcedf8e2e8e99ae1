"""A warm cache's fingerprint: every file's size and sha256, written last, compared on every use."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from envkit.cache.key import CACHE_SUBDIRS, compile_root, untrusted_message
from envkit.support.trust import tree_problems
from envkit.errors import CacheError
from envkit.support.fsops import write_json_atomic
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import file_sha256
from envkit.support.trainer_helpers import read_json_file

FINGERPRINT = "fingerprint.json"


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



def fingerprints() -> list[tuple[Path, dict | None]]:
    """Every fingerprinted cache under the compile root, with its fingerprint (None: corrupted)."""
    found = []
    for path in sorted(compile_root().glob(f"*/{FINGERPRINT}")):
        try:
            found.append((path.parent, read_fingerprint(path.parent)))
        except CacheError:
            found.append((path.parent, None))
    return found


def tampered_names(result: Verification, limit: int = 3) -> str:
    """The first changed, removed or unverifiable entries of a verification, for a message."""
    return ", ".join((result.changed + result.removed + tuple(result.untrusted))[:limit])
