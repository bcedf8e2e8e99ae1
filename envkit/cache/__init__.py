"""The managed compile cache: its env key and private dir (key), the fingerprint that vouches for it
(fingerprint), warming it (warmup), the caches on this machine (store), what it trusts (trust), and
moving a warm cache between machines (port, megacache). Doctor's check of it is in doctor/cachechecks.py.

The names below are the package's public face for the CLI and the launcher.
"""

from envkit.cache.fingerprint import FINGERPRINT, Verification, read_fingerprint, scan, files_digest
from envkit.cache.key import compile_root, describe, ensure_private_dir, env_key, key_parts
from envkit.cache.store import list_caches, prune
from envkit.cache.warmup import WarmResult, layout_args, prove_mitigations, run_selftests, verify, warm, warm_lock

__all__ = ["FINGERPRINT", "Verification", "WarmResult", "compile_root", "describe", "ensure_private_dir", "env_key",
           "files_digest", "key_parts", "layout_args", "list_caches", "prove_mitigations", "prune",
           "read_fingerprint", "run_selftests", "scan", "verify", "warm", "warm_lock"]
