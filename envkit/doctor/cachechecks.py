"""cache.perms and cache.fingerprint: is the compile cache private, warm and unchanged?"""

from __future__ import annotations

import getpass
import os
import stat
import tempfile
from pathlib import Path

from envkit import paths
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


def permission_problem(path: Path) -> str | None:
    """Why a cache dir is unsafe to load code and pickles from, or None if it is private."""
    info = path.stat()
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not you (uid {os.getuid()}): its owner can run code in your training"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"mode {stat.S_IMODE(info.st_mode):o} lets others write pickles and code that training will load"
    return None


def check_perms(ctx: Context) -> list[Finding]:
    findings = []
    checked = 0
    for path in cache_dirs_to_check(ctx.environ):
        if not path.exists():
            continue
        checked += 1
        problem = permission_problem(path)
        if problem:
            findings.append(Finding("cache.perms", Status.FAIL, str(path), problem, f"chmod -R go-rwx {path}"))
    return findings or [Finding("cache.perms", Status.OK, f"{checked} cache dirs",
                                "every compile cache dir present is yours and private")]


def check_fingerprint(ctx: Context) -> list[Finding]:
    from envkit import cache

    return cache.doctor_findings(ctx.venv)
