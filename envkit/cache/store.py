"""The caches on this machine: list them, and prune those no venv can use any more."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from envkit.cache.fingerprint import read_fingerprint
from envkit.cache.key import compile_root
from envkit.errors import CacheError
from envkit.venv.installed import installed_versions
from envkit.venv.managed import Venv


def _tree_size(root: Path) -> int:
    """Bytes of the regular files under root, links neither followed nor counted."""
    if root.is_symlink():
        return 0
    return sum(entry.stat(follow_symlinks=False).st_size for directory, _d, names in os.walk(root)
               for entry in (Path(directory) / name for name in names) if entry.is_file() and not entry.is_symlink())


def list_caches() -> list[dict]:
    rows = []
    # A key dir that is a link is not a cache envkit made (warm-cache makes real dirs): never listed or pruned.
    for cache_dir in sorted(p for p in compile_root().glob("*") if p.is_dir() and not p.is_symlink()):
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
                if os.path.lexists(row["path"]):
                    continue  # not removed (a file in it is not ours to delete): not reported as removed
                Path(row["path"]).with_suffix(".lock").unlink(missing_ok=True)
            removed.append({**row, "reason": reason})
    return removed
