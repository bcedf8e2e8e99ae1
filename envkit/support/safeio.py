"""Reading files a user was handed without being hung, flooded or redirected by them.

Every file envkit reads from a venv, a run dir or an export is opened without following a link
(O_NOFOLLOW) and without blocking on a FIFO (O_NONBLOCK), must be a regular file, and is read only
up to a bound. A symlink, FIFO, device or oversized file is an UnsafeFile, which callers turn into
a finding or a one-line error.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeFile(ValueError):
    """Not a regular file, unreadable, or larger than the bound."""


def open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of a regular file at `path` (a link itself is refused) and its fstat."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeFile(f"a symlink to {os.readlink(path)}") from None
        raise UnsafeFile(exc.strerror or str(exc)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFile("not a regular file (a FIFO, socket or device)")
    return fd, info


def read_bytes(path: Path, limit: int) -> bytes:
    """The whole file, refused when it is larger than `limit` bytes."""
    fd, info = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise UnsafeFile(f"{info.st_size} bytes, more than the {limit} this file ever needs")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"more than the {limit} bytes this file ever needs")
    return data


def read_text(path: Path, limit: int) -> str:
    """read_bytes decoded as UTF-8 (undecodable bytes replaced: the text is shown, never run)."""
    return read_bytes(path, limit).decode("utf-8", errors="replace")
