"""`envkit cache export/import`: a warm compile cache as one file, and taking one in without trusting it.

An export is code from whoever made it (torch unpickles and imports what it holds, HAZARDS.md H5).
`import` therefore accepts a file only when its sha256 equals the digest the user pinned (the
exporter prints it), then checks the header's digests of the blob and of every artifact, each
artifact's kind and key (envkit.megacache), and the env key, all before torch sees a byte. torch
loads the blob into a fresh private staging dir; only what landed there is fingerprinted, and the
staging dir replaces the env key's cache in one rename.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tempfile
import time
import zipfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from envkit.cache import megacache
from envkit.cache.fingerprint import read_fingerprint, scan, write_fingerprint
from envkit.cache.key import CACHE_SUBDIRS, compile_root, ensure_private_dir, env_key, key_parts
from envkit.cache.warmup import warm
from envkit.errors import CacheError
from envkit.support.fsops import exchange
from envkit.support.safeio import UnsafeFile, read_bytes
from envkit.support.text import printable
from envkit.trainerproc.process import run_trainer, trainer_env
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import atomic_write, file_sha256, loads_json

EXPORT_HEADER = "envkit-cache.json"
EXPORT_BLOB = "mega-cache.bin"
FORMAT = "envkit-cache/2"
MAX_BLOB = 8 << 30  # far above a real cache (16 MB for three flex_attention shapes); refuses a zip bomb
MAX_EXPORT_FILE = 4 << 30  # the export is read into memory once, hashed and parsed from there
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def export(venv: Venv, target: Path, preset: str | None = None, config: str | None = None, *,
           quiet: bool = False) -> dict:
    """Warm (hits on a warm cache), capture torch's Mega-Cache blob, write it with its digests as one file."""
    target = Path(target).absolute()
    if not target.parent.is_dir():  # before minutes of warm-up, not after
        raise CacheError(f"{target.parent} does not exist; create it or choose another path for the export")
    with tempfile.TemporaryDirectory(prefix="envkit-export-") as tmp:
        blob_path = Path(tmp) / EXPORT_BLOB
        result = warm(venv, preset, config, quiet=quiet, export=blob_path)
        blob = blob_path.read_bytes()
        try:
            artifacts = megacache.parse(blob)
        except megacache.BlobError as exc:
            raise CacheError(f"torch wrote a Mega-Cache blob envkit cannot vouch for ({exc}); nothing exported") from None
        fingerprint = read_fingerprint(Path(result.cache_dir))
        header = {"format": FORMAT, "env_key": result.env_key, "key_parts": fingerprint["key_parts"],
                  "buckets": result.buckets, "blob_sha256": hashlib.sha256(blob).hexdigest(),
                  "artifacts": [asdict(a) for a in artifacts],
                  "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}

        def write_archive(handle) -> None:
            with zipfile.ZipFile(handle, "w") as archive:
                archive.writestr(EXPORT_HEADER, json.dumps(header, indent=2, sort_keys=True))
                archive.writestr(EXPORT_BLOB, blob)

        atomic_write(target, write_archive, mode=0o666)
    return {"file": str(target), "env_key": result.env_key, "bytes": target.stat().st_size,
            "sha256": file_sha256(target), "artifacts": len(artifacts)}


def _read_export(source: Path, data: bytes) -> tuple[dict, bytes]:
    """Header and blob of an export (its bytes, read once), every field checked, nothing written."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = sorted(info.filename for info in archive.infolist())
            if names != sorted([EXPORT_HEADER, EXPORT_BLOB]):
                raise ValueError(f"expected exactly {EXPORT_HEADER} and {EXPORT_BLOB}, found {names[:5]}")
            if archive.getinfo(EXPORT_BLOB).file_size > MAX_BLOB or archive.getinfo(EXPORT_HEADER).file_size > 64 << 20:
                raise ValueError("larger than any compile cache")
            header = loads_json(archive.read(EXPORT_HEADER))
            blob = archive.read(EXPORT_BLOB)
    except (OSError, KeyError, zipfile.BadZipFile, ValueError, UnicodeDecodeError) as exc:
        raise CacheError(f"{source} is not an envkit cache export ({exc}); make one with `envkit cache export`") from None
    problem = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        problem = f"its header is not format {FORMAT} (made by another envkit?)"
    elif not isinstance(header.get("env_key"), str) or not isinstance(header.get("key_parts"), dict):
        problem = "its header has no env key"
    elif not isinstance(header.get("buckets"), list) or not all(isinstance(b, int) for b in header["buckets"]):
        problem = "its header's buckets are not a list of lengths"
    elif not isinstance(header.get("blob_sha256"), str) or not HEX64.fullmatch(header["blob_sha256"]):
        problem = "its header has no blob digest"
    elif not isinstance(header.get("artifacts"), list):
        problem = "its header lists no artifacts"
    if problem:
        raise CacheError(f"{source}: {problem}; make a new export with `envkit cache export`")
    return header, blob


def _check_blob(source: Path, header: dict, blob: bytes) -> list[megacache.Artifact]:
    if hashlib.sha256(blob).hexdigest() != header["blob_sha256"]:
        raise CacheError(f"{source}: the blob does not match its header's digest: altered after export; refused")
    try:
        artifacts = megacache.parse(blob)
    except megacache.BlobError as exc:
        raise CacheError(f"{source}: refused: the Mega-Cache blob {exc}") from None
    listed = sorted(json.dumps(a, sort_keys=True) for a in header["artifacts"])
    if sorted(json.dumps(asdict(a), sort_keys=True) for a in artifacts) != listed:
        raise CacheError(f"{source}: the blob's artifacts differ from those its header lists; refused")
    return artifacts


def import_(venv: Venv, source: Path, *, sha256: str | None, preset: str | None = None,
            config: str | None = None) -> dict:
    started = time.perf_counter()
    if not sha256:
        raise CacheError(f"an import runs code from whoever made {source.name} (torch loads pickles and generated "
                         f"code from it); pin the file you trust: --sha256 <digest> (`envkit cache export` prints it, "
                         f"or `sha256sum` it where it was made)")
    if not HEX64.fullmatch(sha256.lower()):
        raise CacheError(f"--sha256 must be 64 hex digits, not {sha256!r}")
    try:  # read once, as a regular file, bounded: a FIFO or a link to /dev/zero is refused, not hashed forever
        data = read_bytes(source, MAX_EXPORT_FILE)
    except UnsafeFile as exc:
        raise CacheError(f"{printable(source)} cannot be imported: {exc}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256.lower():
        raise CacheError(f"{source} has sha256 {actual[:16]}..., not the pinned {sha256[:16]}...: this is not the "
                         f"file you trusted; refused, nothing written")
    header, blob = _read_export(source, data)
    artifacts = _check_blob(source, header, blob)
    parts = key_parts(venv, preset or header["key_parts"].get("preset"), config)
    key = env_key(parts)
    if key != header["env_key"]:
        differs = ", ".join(f"{k}: exported {header['key_parts'].get(k)!r}, here {v!r}"
                            for k, v in parts.items() if header["key_parts"].get(k) != v)
        raise CacheError(f"{source} was exported for env key {header['env_key']}, this venv needs {key} ({differs}); "
                         f"export it from a matching environment or run `envkit warm-cache` here")
    cache_dir = compile_root() / key
    ensure_private_dir(cache_dir)
    with FileLock(str(cache_dir.with_suffix(".lock"))):
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.import-", dir=compile_root()))
        try:
            for sub in CACHE_SUBDIRS:
                (staging / sub).mkdir(mode=0o700)
            blob_path = staging / EXPORT_BLOB
            blob_path.write_bytes(blob)
            load = ["load-cache", str(blob_path), "--sha256", header["blob_sha256"]]
            loaded = json.loads(run_trainer(venv, load, trainer_env(venv, staging)).stdout.strip().splitlines()[-1])
            blob_path.unlink()
            if not loaded.get("loaded") or not scan(staging):
                raise CacheError(f"torch loaded nothing from {source} (made by another torch build?); the cache was "
                                 f"left as it was")
            fingerprint = write_fingerprint(staging, parts, header["buckets"], {}, venv, key=key)
            if not exchange(staging, cache_dir):
                shutil.rmtree(cache_dir)
                staging.rename(cache_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return {"cache_dir": str(cache_dir), "env_key": key, "files": len(fingerprint["files"]),
            "artifacts": len(artifacts), "fingerprint": fingerprint["digest"],
            "seconds": round(time.perf_counter() - started, 2)}
