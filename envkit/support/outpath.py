"""The one check of a file a user names for envkit to write (`--out`): a regular file or nothing yet, in a directory
that exists. A symlink, a FIFO or a device node is refused before any work: writing through a link would land
elsewhere, and opening a FIFO blocks. Replacing the file itself is atomic_write's (temp sibling, rename)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from envkit.errors import EnvkitError
from envkit.support.text import printable


def checked_output(path: str | Path, flag: str = "--out") -> Path:
    out = Path(path).absolute()
    shown = printable(str(path))
    try:
        info = os.lstat(out)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise EnvkitError(f"{flag} {shown}: {exc.strerror}; choose another path") from None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise EnvkitError(f"{flag} {shown} is a symlink; give the real path of the file to write")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise EnvkitError(f"{flag} {shown} is not a regular file (a directory, FIFO, socket or device); choose "
                          f"another path")
    if not out.parent.is_dir():
        raise EnvkitError(f"{flag} {shown}: the directory {printable(str(out.parent))} does not exist; create it "
                          f"first or choose another path")
    return out
