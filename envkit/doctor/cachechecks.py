"""cache.perms and cache.fingerprint: is the compile cache private, warm and unchanged?"""

from __future__ import annotations

import getpass
import os
import shlex
import tempfile
from pathlib import Path

from envkit import paths
from envkit.cache.fingerprint import FINGERPRINT, compare, fingerprints, tampered_names
from envkit.cache.key import compile_root
from envkit.support.trust import tree_problems
from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Status
from envkit.venv.installed import installed_versions
from envkit.trainerproc.source import trainer_digest


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
                                    f"chmod -R go-w {shlex.quote(str(root))} (and remove links), or "
                                    f"rm -rf {shlex.quote(str(path))}"))
        if len(problems) > 5:
            findings.append(Finding("cache.perms", Status.FAIL, str(root),
                                    f"{len(problems) - 5} more unsafe entries under this cache",
                                    f"rm -rf {shlex.quote(str(root))}"))
    return findings or [Finding("cache.perms", Status.OK, f"{checked} cache dirs",
                                "every compile cache dir present is yours and private, every entry in it too")]


def _mentions(path: Path, text: str) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes()[: 64 << 20]
    except OSError:
        return False


def check_fingerprint(ctx: Context) -> list[Finding]:
    """cache.fingerprint, read from outside (no torch import): fingerprints this venv made, re-hashed."""
    venv = ctx.venv
    fix = f"envkit warm-cache --venv {shlex.quote(str(venv.path))}"
    # A corrupted fingerprint names no venv for sure: it is this venv's only if its bytes name this venv
    # (an unrelated broken cache must not fail every venv's doctor; `envkit cache ls` shows it).
    mine = [(d, f) for d, f in fingerprints()
            if (f is None and _mentions(d / FINGERPRINT, str(venv.path))) or (f and f.get("venv") == str(venv.path))]
    installed = installed_versions(venv.site_packages())
    if not mine and "torch" not in installed:
        return [Finding("cache.fingerprint", Status.OK, str(compile_root()), "torch is not installed: nothing compiles")]
    if not mine:
        return [Finding("cache.fingerprint", Status.WARN, str(compile_root()),
                        "no fingerprinted compile cache for this venv: the first steps of every bucket compile cold",
                        fix)]
    findings = []
    now = {"torch": installed.get("torch"), "triton": installed.get("triton"),
           "python": venv.python_version(), "trainer": trainer_digest()}
    for cache_dir, fingerprint in mine:
        if fingerprint is None:
            findings.append(Finding("cache.fingerprint", Status.FAIL, str(cache_dir),
                                    f"{FINGERPRINT} is corrupted: this cache cannot be trusted",
                                    f"rm -rf {shlex.quote(str(cache_dir))} && {fix}"))
            continue
        result = compare(cache_dir, fingerprint)
        if result.tampered:
            # A command's cache (`envkit run`) is rebuilt by its next run; the trainer's by warm-cache.
            remove = f"rm -rf {shlex.quote(str(cache_dir))}"
            findings.append(Finding("cache.fingerprint", Status.FAIL, str(cache_dir),
                                    f"{len(result.changed)} changed, {len(result.removed)} removed and "
                                    f"{len(result.untrusted)} unverifiable entries since fingerprinted ({tampered_names(result)}): "
                                    f"corruption or tampering",
                                    remove if _is_command_cache(fingerprint) else f"{remove} && {fix}"))
            continue
        old = fingerprint.get("key_parts", {})
        stale = {k: (old.get(k), v) for k, v in now.items() if k in old and old.get(k) != v}
        if stale:
            what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in stale.items())
            findings.append(Finding("cache.fingerprint", Status.WARN, str(cache_dir),
                                    f"stale for this venv ({what}): training would compile cold", fix))
            continue
        growth = f", {len(result.added)} files added since (growth)" if result.added else ""
        findings.append(Finding("cache.fingerprint", Status.OK, str(cache_dir),
                                f"{_owner(old)}: {len(fingerprint['files'])} files match their "
                                f"fingerprint{growth}"))
    return findings


def _is_command_cache(fingerprint: dict) -> bool:
    parts = fingerprint.get("key_parts")
    return isinstance(parts, dict) and parts.get("kind") == "command"


def _owner(key_parts: dict) -> str:
    """Whose cache it is: the trainer's for a preset, or a command's (`envkit run`) for a code identity."""
    return f"preset {key_parts.get('preset')}" if "preset" in key_parts else f"`envkit run` code {key_parts.get('code')}"
