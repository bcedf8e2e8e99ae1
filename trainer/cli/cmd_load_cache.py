"""`python -m trainer load-cache`: a Mega-Cache blob envkit verified, loaded into the compile cache."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainer.common.errors import TrainerInputError

NAME = "load-cache"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="load a verified Mega-Cache blob into the compile cache (envkit's `cache "
                                  "import` calls it, after verification)")
    p.add_argument("blob")
    p.add_argument("--sha256", required=True, help="the digest envkit verified the blob against")


def run(args) -> int:
    """Load a Mega-Cache blob into the cache dirs named by TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR."""
    import hashlib

    import torch

    started = time.perf_counter()
    blob = Path(args.blob).read_bytes()
    # torch writes these artifacts and unpickles some (HAZARDS.md H5). Only envkit's `cache import` calls
    # this, after it checked the export against the user's pinned sha256, the blob against the header's
    # digest, and every artifact's kind, key and digest (envkit/cache/port.py, envkit/cache/megacache.py); the
    # digest it verified is checked again here, so bytes changed since then are never loaded.
    if hashlib.sha256(blob).hexdigest() != args.sha256:
        raise TrainerInputError(f"{args.blob} is not the blob envkit verified (sha256 differs); nothing loaded")
    # Unpickles: the blob was verified by envkit (pinned export, header, every artifact) and its sha256 is
    # rechecked just above, so only bytes produced or verified by envkit reach torch's loader.
    info = torch.compiler.load_cache_artifacts(blob)
    counts = {kind: len(keys) for kind, keys in info.artifacts.items()} if info is not None else {}
    print(json.dumps({"loaded": bool(counts and any(counts.values())), "artifacts": counts,
                      "seconds": round(time.perf_counter() - started, 2)}))
    return 0
