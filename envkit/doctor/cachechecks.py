"""cache.perms and cache.fingerprint: is the compile cache private, warm and unchanged?"""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

from envkit import paths
from envkit.cachetrust import tree_problems
from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Status


def cache_dirs_to_check(environ: dict[str, str]) -> list[Path]:
    """envkit's managed cache, caches named in the environment, and torch's default temp cache."""
    candidates = [paths.cache_root() / "compile"]
    candidates += [Path(environ[v]) for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR") if environ.get(v)]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    candidates.append(Path(tempfile.gettempdir()) / f"torchinductor_{user}")
    unique = []
    for path in candidates:
        if path not in unique:
            unique.append(path)
    return unique


def check_perms(ctx: Context) -> list[Finding]:
    """Every directory and file of each cache, not only its root: torch loads from all of them."""
    findings = []
    checked = 0
    for root in cache_dirs_to_check(ctx.environ):
        if not root.exists() and not root.is_symlink():
            continue
        checked += 1
        # A root the user linked elsewhere (another disk) is judged by its target; below it, links are refused.
        problems = tree_problems(root.resolve() if root.is_symlink() else root)
        for name, problem in list(problems.items())[:5]:
            path = root if name == "." else root / name
            findings.append(Finding("cache.perms", Status.FAIL, str(path), problem,
                                    f"chmod -R go-w {root} (and remove links), or rm -rf {path}"))
        if len(problems) > 5:
            findings.append(Finding("cache.perms", Status.FAIL, str(root),
                                    f"{len(problems) - 5} more unsafe entries under this cache", f"rm -rf {root}"))
    return findings or [Finding("cache.perms", Status.OK, f"{checked} cache dirs",
                                "every compile cache dir present is yours and private, every entry in it too")]


def check_fingerprint(ctx: Context) -> list[Finding]:
    from envkit import cache

    return cache.doctor_findings(ctx.venv)
