"""The trainer across the transformers it supports: a tiny run on the newest (the `cpu-newest` profile), its walk,
its export loaded by the reference `dflash`, and logs with no warning in them (docs/trainer.md, "transformers").

The tiny preset's compiled region is the trainer's own drafter, so the shared warm cache serves this venv too (the
env key holds torch, not transformers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from helpers import run_envkit

pytestmark = pytest.mark.e2e

# What a warning looks like in a log: Python's warnings, torch's glog-style lines (W1205 17:21:15.123 ...), a
# logger's "WARNING", anything that says deprecated.
WARNING_LINE = re.compile(r"\w*Warning\b|warnings\.warn|^W\d{4} \d\d:|\bWARNING\b|deprecat", re.IGNORECASE)


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if WARNING_LINE.search(line)]


def test_the_demo_run_prints_no_warning(tiny_run):
    run_dir, _, stdout = tiny_run
    assert warnings_in((run_dir / "train.log").read_text()) == []
    assert warnings_in(stdout) == []


def test_the_newest_transformers_trains_walks_and_exports(warm_cache_root, tmp_path):
    """The tiny preset's shapes (the shared warm cache hits) with less data and a short walk on the newest
    transformers (5.25.0 today), whose cache API and forward argument differ from the lock's 5.6.0
    (trainer/data/decode_cache.py): it trains, walks losslessly through the KV cache, exports, and the reference
    `dflash` loads the export. The same figures on every version: bench/transformers_range.py."""
    shutil.copytree(warm_cache_root, tmp_path / "cache", symlinks=True)
    env = dict(os.environ, ENVKIT_CACHE_DIR=str(tmp_path / "cache"), ENVKIT_RUNS_DIR=str(tmp_path / "runs"),
               ENVKIT_HOME=str(tmp_path / "home"))
    config = tmp_path / "short.json"
    config.write_text(json.dumps({"preset": "tiny", "steps": 40, "walk_prompts": 4, "walk_new_tokens": 32,
                                  "data": {"num_sequences": 128, "eval_sequences": 8}}))
    proc = run_envkit("train", "--profile", "cpu-newest", "--config", str(config), "--name", "newest", env=env,
                      timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "newest"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["versions"]["transformers"] == "5.25.0" and record["profile"] == "cpu-newest"
    summary = record["summary"]
    assert summary["walk_prompts"] == 4 and summary["walk_near_ties"] == 0 and summary["walk_tau"] >= 1.0, summary
    assert summary["fxgraph_cache_miss"] == 0, summary  # the env key holds torch, not transformers: the cache hits
    assert warnings_in((run_dir / "train.log").read_text()) == []

    out = tmp_path / "served"
    exported = run_envkit("export", "newest", "--out", str(out), env=env)
    assert exported.returncode == 0, exported.stderr
    dflash_model = pytest.importorskip("dflash.model", reason="make test installs the reference dflash (--no-deps)")
    draft, info = dflash_model.DFlashDraftModel.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    assert json.loads((Path(out) / "config.json").read_text())["dflash_config"]["target_layer_ids"]
