"""What makes a compile cache dir safe to load code from: owned by you, private, plain files only.

torch loads cache entries with pickle and imports generated code (HAZARDS.md H5): whoever can write
any file or directory of the cache, or plant a link that torch follows, runs code in training. These
checks never follow a link and never open anything but a regular file, so a planted FIFO cannot hang them.
The rule itself (trainer/common/files.py permission_problem) is the one envkit's own state and built targets follow.
"""

from __future__ import annotations

import os
from pathlib import Path

from envkit.support.trainer_helpers import permission_problem as _entry_problem

# Why each kind of problem matters in a compile cache, after what the rule found.
_CONSEQUENCE = {"a symlink": "torch would follow it outside what the fingerprint covers",
                "owned by": "its owner can run code in your training",
                "mode": "others can write pickles and code that training will load"}


def permission_problem(path: Path) -> str | None:
    """Why one cache entry is unsafe, or None. Reads the entry itself (lstat), never a link's target."""
    problem = _entry_problem(path)
    if problem is None:
        return None
    why = next((text for start, text in _CONSEQUENCE.items() if problem.startswith(start)), "")
    return f"{problem} ({why})" if why else problem


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
