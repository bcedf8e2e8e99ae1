"""warm-cache on CPU: the tiny preset through SDPA compiles with inductor's C++ path."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import copy_root, run_envkit, run_json
from trainer.config.schema import tiny

pytestmark = pytest.mark.e2e


def cache_env(root: Path) -> dict:
    return dict(os.environ, ENVKIT_CACHE_DIR=str(root))


def warm_json(venv: Path, root: Path) -> dict:
    return json.loads(run_envkit("warm-cache", "--venv", str(venv), "--json", env=cache_env(root), check=True).stdout)


def warmers(warm_cache_root: Path) -> list[dict]:
    """The `--json` outputs of the two warmers that warmed the session's root at once (conftest.py), the one
    that compiled first."""
    outputs = json.loads((warm_cache_root / "warmers.json").read_text())
    return sorted(outputs, key=lambda out: -out["counters"]["fxgraph_cache_miss"])


def test_first_warm_misses_second_hits_with_same_fingerprint(cpu_venv, warm_cache_root):
    first = warmers(warm_cache_root)[0]
    assert first["counters"]["fxgraph_cache_miss"] > 0 and first["counters"]["autograd_cache_miss"] > 0
    assert first["buckets"] == tiny().data.buckets  # every bucket of the preset
    second = warm_json(cpu_venv, warm_cache_root)
    assert second["counters"]["fxgraph_cache_miss"] == 0 and second["counters"]["fxgraph_cache_hit"] > 0
    # AOTAutograd's cache hits too (autocast entered around the compiled region, not inside it): a later process
    # skips tracing forward and backward, not only inductor's codegen.
    assert second["counters"]["autograd_cache_miss"] == 0 and second["counters"]["autograd_cache_hit"] > 0
    assert second["fingerprint"] == first["fingerprint"] and second["env_key"] == first["env_key"]
    cache_dir = Path(second["cache_dir"])
    assert cache_dir == warm_cache_root / "compile" / second["env_key"]
    for path in (cache_dir, cache_dir / "inductor", warm_cache_root / "compile"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    fingerprint = json.loads((cache_dir / "fingerprint.json").read_text())
    assert fingerprint["key_parts"]["torch"] == "2.13.0+cpu" and fingerprint["key_parts"]["device"].startswith("cpu")
    assert all(len(entry) == 3 for entry in fingerprint["files"])


def test_tampering_is_named_by_verify_and_doctor(cpu_venv, warm_cache_root, tmp_path):
    root = copy_root(warm_cache_root, tmp_path / "root")
    env = cache_env(root)
    assert run_envkit("warm-cache", "--venv", str(cpu_venv), "--verify", env=env).returncode == 0
    cache_dir = next((root / "compile").glob("*/fingerprint.json")).parent
    victim = sorted((cache_dir / "inductor").rglob("*.py"))[0]
    victim.write_text(victim.read_text() + "\nimport os  # injected\n")
    (cache_dir / "inductor" / "new-entry.bin").write_bytes(b"growth")
    relative = str(victim.relative_to(cache_dir))
    proc = run_envkit("warm-cache", "--venv", str(cpu_venv), "--verify", "--json", env=env)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1 and result["changed"] == [relative] and result["removed"] == []
    assert result["added"] == ["inductor/new-entry.bin"]
    doctor = json.loads(run_envkit("doctor", "--venv", str(cpu_venv), "--json", env=env).stdout)
    finding = next(f for f in doctor["findings"] if f["id"] == "cache.fingerprint")
    assert finding["status"] == "fail" and relative in finding["message"]
    refused = run_envkit("warm-cache", "--venv", str(cpu_venv), env=env)
    assert refused.returncode == 1 and "cannot be trusted" in refused.stderr


def test_concurrent_warmers_serialise(cpu_venv, warm_cache_root, tmp_path):
    """Two warmers of one cold cache (the session's root was warmed by two at once): the lock makes the second
    wait, so it only hits what the first compiled. Without the lock both would compile (both miss), and this
    fails."""
    compiled, waited = warmers(warm_cache_root)
    assert compiled["counters"]["fxgraph_cache_miss"] > 0 and waited["counters"]["fxgraph_cache_miss"] == 0
    assert waited["counters"]["fxgraph_cache_hit"] > 0 and waited["fingerprint"] == compiled["fingerprint"]
    root = copy_root(warm_cache_root, tmp_path / "root")
    verify = [sys.executable, "-m", "envkit", "warm-cache", "--venv", str(cpu_venv), "--verify"]
    assert subprocess.run(verify, env=cache_env(root), capture_output=True).returncode == 0


def test_refuses_a_cache_dir_others_can_write(cpu_venv, tmp_path):
    root = tmp_path / "root"
    (root / "compile").mkdir(parents=True)
    (root / "compile").chmod(0o777)
    proc = run_envkit("warm-cache", "--venv", str(cpu_venv), env=cache_env(root))
    assert proc.returncode == 1 and "chmod -R go-rwx" in proc.stderr


def test_corrupted_fingerprint(cpu_venv, warm_cache_root, tmp_path):
    root = copy_root(warm_cache_root, tmp_path / "root")
    fingerprint = next((root / "compile").glob("*/fingerprint.json"))
    fingerprint.write_text("{ truncated")
    proc = run_envkit("warm-cache", "--venv", str(cpu_venv), "--verify", env=cache_env(root))
    assert proc.returncode == 1 and "corrupted" in proc.stderr and "remove" in proc.stderr


def test_venv_without_torch(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "notorch"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    proc = run_envkit("warm-cache", "--venv", str(venv))
    assert proc.returncode == 1 and "has no torch" in proc.stderr


def test_cache_prune_removes_only_caches_no_venv_uses(tmp_path, monkeypatch):
    from envkit.cache.fingerprint import files_digest

    root = tmp_path / "cache-root"
    monkeypatch.setenv("ENVKIT_CACHE_DIR", str(root))
    live_venv = tmp_path / "live"
    subprocess.run([sys.executable, "-m", "uv", "venv", str(live_venv), "-q"], check=True)
    python = next(line.split("=", 1)[1].strip() for line in (live_venv / "pyvenv.cfg").read_text().splitlines()
                  if line.startswith(("version_info", "version ")))

    def cache(key: str, venv: Path, torch: str | None) -> Path:
        path = root / "compile" / key
        (path / "inductor").mkdir(parents=True, mode=0o700)
        (path / "fingerprint.json").write_text(json.dumps({
            "key_parts": {"torch": torch, "python": python}, "venv": str(venv), "files": [],
            "digest": files_digest({})}))
        return path

    gone = cache("a" * 16, tmp_path / "deleted-venv", None)
    kept = cache("b" * 16, live_venv, None)  # no torch then, no torch now: still this venv's cache
    preview = run_json("cache", "prune", "--dry-run")
    assert [Path(row["path"]).name for row in preview] == [gone.name] and "is gone" in preview[0]["reason"]
    assert gone.exists()
    run_envkit("cache", "prune", check=True)
    assert not gone.exists() and kept.exists()


def test_cache_prune_never_reports_a_link_it_did_not_remove(tmp_path):
    root = Path(os.environ["ENVKIT_CACHE_DIR"]) / "compile"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fingerprint.json").write_text(json.dumps({"digest": "x", "venv": "/gone", "key_parts": {}}))
    root.mkdir(parents=True)
    (root / "k").symlink_to(elsewhere)
    pruned = json.loads(run_envkit("cache", "prune", "--json", check=True).stdout)
    assert pruned == []
    assert (elsewhere / "fingerprint.json").exists()
