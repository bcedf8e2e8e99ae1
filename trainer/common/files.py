"""Writing and reading files safely: one atomic write, one sha256, one JSON-record reader. Torch-free, so
envkit uses the same ones (envkit/support/fsops.py, envkit/support/safeio.py)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def atomic_write(path: Path, data: str | bytes | Callable[[BinaryIO], None], *, mode: int = 0o644) -> None:
    """Readers see the old file or the new one, never half of one: a temp file in the same dir, fsync,
    rename; the temp file is removed on any failure. `data` is the content, or a function that writes it
    to the open file (a checkpoint, an archive). `mode` is applied through the umask, as open() would."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, mode & ~umask)
        with os.fdopen(fd, "wb") as handle:
            if callable(data):
                data(handle)
            else:
                handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def weights_digest(directory: Path) -> str:
    """sha256 over a model dir's safetensors files, names and bytes: the identity of a target's weights."""
    digest = hashlib.sha256()
    for path in sorted(Path(directory).glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0" + file_sha256(path).encode())
    return digest.hexdigest()


def read_json_file(path: Path, *, limit: int = 64 << 20):
    """JSON from a regular file, without following a link or blocking on a FIFO; ValueError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"cannot open: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes, more than {limit} allowed")
        return loads_json(handle.read())


def loads_json(data: str | bytes):
    """json.loads for bytes someone else wrote: nesting too deep for the parser is a ValueError like any other
    malformed JSON (json raises RecursionError there, which no caller expects)."""
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def loads_exchanged_json(data: str | bytes):
    """loads_json for JSON exchanged with others (prompt rows, a server's replies): NaN, Infinity and numbers that
    overflow to infinity are not JSON (RFC 8259), so they are a ValueError here, never a float to write back out."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not a JSON value")

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"the number {text[:24]} overflows to infinity")
        return value

    try:
        return json.loads(data, parse_constant=refuse, parse_float=finite)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def permission_problem(path: Path) -> str | None:
    """Why an entry someone else could have written is not to be trusted, or None: a link, not a regular file or
    directory, owned by another user, or writable by group or others. Reads the entry itself (lstat)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return f"a symlink to {os.readlink(path)!r}"
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return "not a regular file or directory (a FIFO, socket or device)"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not you (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"mode {stat.S_IMODE(info.st_mode):o}: others can write it"
    return None


def open_lock_file(path: Path) -> int:
    """A lock file's descriptor, created 0600 if absent; a link planted at its name is refused, never followed
    (a plain open(path, "w") would truncate whatever it points at)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ValueError(f"cannot open the lock file {str(path)!r}: {exc.strerror}"
                         + (" (a symlink: remove it)" if os.path.islink(path) else "")) from None


class ExclusiveLock:
    """An exclusive lock on a lock file (open_lock_file's rules), held for a `with` block: one writer or builder at
    a time across processes. The file is opened when the lock is made, so a caller tells a refused lock file
    (ValueError, there) from what its own block raises. The kernel drops the lock with the process."""

    def __init__(self, path: Path):
        self.fd = open_lock_file(path)

    def __enter__(self) -> "ExclusiveLock":
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info) -> None:
        os.close(self.fd)


def envkit_home() -> Path:
    """ENVKIT_HOME as envkit resolves it (default $XDG_DATA_HOME/envkit): built targets and token stores live there."""
    home = os.environ.get("ENVKIT_HOME")
    if home:
        return Path(home).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME")
    return (Path(data_home).expanduser() if data_home else Path.home() / ".local" / "share") / "envkit"


def read_json_record(path: Path, *, limit: int = 64 << 20) -> dict | None:
    """A JSON object from a regular file, or None when it is missing, not a regular file, too large,
    malformed or not an object: a record the trainer reads as data."""
    try:
        record = read_json_file(path, limit=limit)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def follow_umask(root: Path) -> None:
    """Modes as a plain write would give them: mkdtemp makes 0700 and safetensors writes 0600, so without
    this a serving account could not read the export."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(root, 0o777 & ~mask)
    for path in root.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
