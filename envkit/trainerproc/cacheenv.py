"""The variables through which torch finds, redirects or bypasses its compile cache, and envkit's value for each.

A run's cache is the private, fingerprinted dir envkit verified; a caller's variable that points torch at another
dir, turns on a remote cache (whose entries no fingerprint covers) or turns caching off would make that promise
empty without a word. So every process envkit starts on a cache gets these values, and preflight names each
caller's variable it replaced (SECURITY.md, "What a run's environment is").
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

# Fixed values: a remote cache is off, the local caches are on, nothing forces them off.
FIXED = {
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0",
}
# Variables that name a remote cache's server: unset, so nothing of the caller's reaches torch.
REMOVED = ("TORCHINDUCTOR_REDIS_HOST", "TORCHINDUCTOR_REDIS_PORT", "TORCHINDUCTOR_REDIS_URL")


def cache_values(cache_dir: Path) -> dict[str, str]:
    """What every process on the private cache `cache_dir` is given."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"), "TRITON_CACHE_DIR": str(cache_dir / "triton"),
            **FIXED}


def apply(environ: Mapping[str, str], cache_dir: Path) -> dict[str, str]:
    """`environ` with envkit's cache values set and the remote cache's server unset."""
    env = {name: value for name, value in environ.items() if name not in REMOVED}
    return env | cache_values(cache_dir)


def overridden(environ: Mapping[str, str], cache_dir: Path) -> list[str]:
    """The caller's variables that envkit replaces or unsets for this cache (names only: values may be secrets)."""
    values = cache_values(cache_dir)
    return sorted([name for name, value in values.items() if name in environ and environ[name] != value]
                  + [name for name in REMOVED if name in environ])


def override_note(names: list[str]) -> str | None:
    """One line for preflight, or None when the caller set nothing envkit replaces."""
    if not names:
        return None
    return (f"env: {', '.join(names)} replaced by envkit's value (the run's compile cache is its private, "
            f"fingerprinted dir; a remote, redirected or disabled cache would bypass it)")
