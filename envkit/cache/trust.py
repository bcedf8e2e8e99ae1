"""What makes a compile cache dir safe to load code from: owned by you, private, plain files only.

torch loads cache entries with pickle and imports generated code (HAZARDS.md H5): whoever can write
any file or directory of the cache, or plant a link that torch follows, runs code in training. These
checks never follow a link and never open anything but a regular file, so a planted FIFO cannot hang them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def permission_problem(path: Path) -> str | None:
    """Why one cache entry is unsafe, or None. Reads the entry itself (lstat), never a link's target."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return f"a symlink to {os.readlink(path)} (torch would follow it outside what the fingerprint covers)"
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return "not a regular file or directory (a FIFO, socket or device)"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not you (uid {os.getuid()}): its owner can run code in your training"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"mode {stat.S_IMODE(info.st_mode):o} lets others write pickles and code that training will load"
    return None


def tree_problems(root: Path) -> dict[str, str]:
    """{path relative to root: problem} for root and every entry under it, links not followed."""
    problems = {}
    if not root.exists() and not root.is_symlink():
        return problems
    problem = permission_problem(root)
    if problem:
        return {".": problem}
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(directory) / name
            problem = permission_problem(path)
            if problem:
                problems[str(path.relative_to(root))] = problem
    return problems
