"""Running uv: where its binary is, and turning its failures into envkit errors."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from envkit.errors import EnvkitError, HashMismatchError, UvError
from envkit.support.trainer_helpers import die_with_parent


@functools.cache
def uv_bin() -> str:
    """The uv binary of the `uv` package envkit depends on; a uv on PATH only as a fallback."""
    try:
        import uv

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
        raise EnvkitError("uv is not installed; run `pip install uv` (envkit depends on it)") from None


@functools.cache
def uv_version() -> str:
    out = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[1] if out.split()[1:] else out.strip()


_HASH_MISMATCH = re.compile(
    r"Hash mismatch for `(?P<package>[^`]+)`.*?Expected:\s*(?P<expected>\S+).*?Computed:\s*(?P<computed>\S+)",
    re.DOTALL,
)
_MISSING = re.compile(r"(?:no version of|was not found in|not found in the) .*", re.IGNORECASE)
_NO_PYTHON = re.compile(r"No interpreter found|not found in (?:virtual environments|managed installations)|"
                        r"No download found for request", re.IGNORECASE)


def _short(digest: str) -> str:
    algo, _, hex_digest = digest.partition(":")
    return f"{algo}:{hex_digest[:12]}"


def explain_failure(args: list[str], stderr: str) -> EnvkitError:
    """One readable error from uv's stderr, naming the package and the next step."""
    text = stderr.strip()
    mismatch = _HASH_MISMATCH.search(text)
    if mismatch:
        return HashMismatchError(
            f"hash mismatch for {mismatch['package']}: the lock expects {_short(mismatch['expected'])}..., "
            f"the source served {_short(mismatch['computed'])}...; the artifact changed or the lock is stale: "
            f"check the source, then run `envkit lock` to re-pin"
        )
    if _NO_PYTHON.search(text):
        return UvError(f"the interpreter the profile asks for is not available: {text.splitlines()[-1].strip()}; "
                       f"install it or change `python` in the profile")
    tail = "\n  ".join(line for line in text.splitlines()[-6:] if line.strip())
    if _MISSING.search(text):
        return UvError(f"a locked package is not available from any source:\n  {tail}\n"
                       f"give a wheelhouse with --find-links DIR (with --offline only the uv cache and "
                       f"wheelhouses are used)")
    return UvError(f"`uv {' '.join(args[:2])}` failed:\n  {tail}")


def run_uv(args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run `uv ARGS`; return stdout, or raise an explained error."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("UV_NO_PROGRESS", "1")
    proc = subprocess.run([uv_bin(), *args], capture_output=True, text=True, env=full_env, cwd=cwd,
                          preexec_fn=die_with_parent)
    if proc.returncode != 0:
        raise explain_failure(args, proc.stderr)
    return proc.stdout
