"""The bundled trainer's source digest: part of the compile cache's env key and of a self-test record."""

from __future__ import annotations

import hashlib

from envkit import paths


def trainer_digest() -> str:
    """sha256 over the bundled trainer's sources: a changed model changes the compiled graphs, a changed
    mitigation needs its self-test again."""
    digest = hashlib.sha256()
    root = paths.trainer_root() / "trainer"
    for source in sorted(root.rglob("*.py")):
        digest.update(str(source.relative_to(root)).encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
