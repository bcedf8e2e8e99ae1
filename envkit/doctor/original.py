"""The file as its wheel shipped it, for the diff of a hand edit.

Looked for in the wheelhouses envkit knows (find-links, pip's configuration), in uv's cache of
unpacked wheels and, with --fetch, in a wheel of exactly that version downloaded by pip. A copy is
accepted only when its sha256 equals the venv's RECORD entry for the file: uv hard-links installed
files from its cache, so an edit in place usually edited the cached copy too, and that copy is refused.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from envkit.lock.names import PEP508_NAME
from envkit.lock import wheelhouse
from envkit.lock.uvtool import run_uv

MAX_DIFF_LINES = 12


def record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel_prefix(name: str, version: str) -> str:
    return f"{name.replace('-', '_')}-{version}-".lower()


def _from_wheels(directories, name: str, version: str, relative: str, expected: str) -> bytes | None:
    prefix = _wheel_prefix(name, version)
    for directory in directories:
        for wheel in sorted(Path(directory).glob("*.whl")) if Path(directory).is_dir() else ():
            if not wheel.name.lower().startswith(prefix):
                continue
            try:
                with zipfile.ZipFile(wheel) as archive:
                    data = archive.read(relative)
            except (KeyError, OSError, zipfile.BadZipFile):
                continue
            if record_digest(data) == expected:
                return data
    return None


def _from_uv_cache(dist_info_name: str, relative: str, expected: str) -> bytes | None:
    try:
        root = Path(run_uv(["cache", "dir"]).strip())
    except Exception:  # noqa: BLE001 - no uv cache is no original, not an error of doctor's
        return None
    for dist_info in (root / "archive-v0").glob(f"*/{dist_info_name}"):
        try:
            data = (dist_info.parent / relative).read_bytes()
        except OSError:
            continue
        if record_digest(data) == expected:
            return data
    return None


def _fetched(name: str, version: str, relative: str, expected: str) -> bytes | None:
    # A requirement pip is handed is exactly NAME==VERSION: a direct reference (`pkg @ file://...`) would
    # make it build a project, whatever --only-binary says.
    if not PEP508_NAME.fullmatch(name) or not _plain_version(version):
        return None
    with tempfile.TemporaryDirectory(prefix="envkit-fetch-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--quiet", "-d", tmp, f"{name}=={version}"], capture_output=True, text=True)
        if proc.returncode != 0:
            return None
        return _from_wheels([tmp], name, version, relative, expected)


def _plain_version(version: str) -> bool:
    """A version `packaging` reads, in characters that are never requirement or shell syntax."""
    try:
        Version(version)
    except InvalidVersion:
        return False
    return re.fullmatch(r"[A-Za-z0-9.+!_-]+", version) is not None


def original(dist, relative: str, expected: str, *, fetch: bool, find_links=()) -> bytes | None:
    """The shipped bytes of one file of `dist`, verified against its RECORD digest, or None."""
    local = [link for link in wheelhouse.find_links(find_links) if "://" not in link]
    return (_from_wheels(local, dist.name, dist.version, relative, expected)
            or _from_uv_cache(dist.dist_info.name, relative, expected)
            or (_fetched(dist.name, dist.version, relative, expected) if fetch else None))


def unified_diff(before: bytes, after: bytes, relative: str) -> str:
    lines = list(difflib.unified_diff(before.decode(errors="replace").splitlines(),
                                      after.decode(errors="replace").splitlines(),
                                      f"{relative} (as shipped)", f"{relative} (in the venv)", lineterm="", n=1))
    if len(lines) > MAX_DIFF_LINES:
        lines = lines[:MAX_DIFF_LINES] + [f"... {len(lines) - MAX_DIFF_LINES} more lines"]
    return "\n".join(lines)
