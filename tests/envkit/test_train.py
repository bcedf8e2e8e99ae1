"""`envkit train` end to end on the tiny preset: preflight, run dir, runs, detach, SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import one_line_error, run_envkit

pytestmark = pytest.mark.e2e


@pytest.fixture
def train_env(warm_cache_root, tmp_path) -> dict:
    root = tmp_path / "cache-root"
    shutil.copytree(warm_cache_root, root, symlinks=True)  # runs may add entries; keep the shared one pristine
    return dict(os.environ, ENVKIT_CACHE_DIR=str(root), ENVKIT_RUNS_DIR=str(tmp_path / "runs"))


@pytest.fixture
def short_tiny(tmp_path) -> str:
    """The tiny preset's shapes (they decide the cache key, so the warm cache hits) with less data to generate,
    a shorter evaluation and walk: what these tests check is the run's bookkeeping, not what it learns."""
    config = tmp_path / "short.json"
    config.write_text(json.dumps({"preset": "tiny", "walk_prompts": 2, "walk_new_tokens": 16,
                                  "data": {"num_sequences": 64, "eval_sequences": 4}}))
    return str(config)


def runs_json(env) -> list[dict]:
    return json.loads(run_envkit("runs", "--json", env=env, check=True).stdout)


def wait_for(predicate, timeout=300, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_foreground_run_records_everything(cpu_venv, train_env, short_tiny, tmp_path):
    proc = run_envkit("train", "--venv", str(cpu_venv), "--config", short_tiny, "--name", "fg", "--", "--steps", "20",
                      env=train_env)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / "fg"
    assert {"run.json", "train.log", "metrics.jsonl", "checkpoint.pt"} <= {p.name for p in run_dir.iterdir()}
    record = json.loads((run_dir / "run.json").read_text())
    for field in ("config", "lock_digest", "env_key", "cache_fingerprint", "git_commit", "command", "host",
                  "started_at", "ended_at"):
        assert record[field], field
    assert record["status"] == "finished" and record["exit_code"] == 0
    assert record["versions"]["torch"] == "2.13.0+cpu" and record["versions"]["transformers"] == "5.6.0"
    assert record["config"]["preset"] == "tiny" and record["summary"]["recompiles"] == 0
    assert record["summary"]["fxgraph_cache_miss"] == 0  # the warm cache was used
    log = (run_dir / "train.log").read_text()
    assert "step    20" in log
    [how] = [line for line in log.splitlines() if line.startswith("run: ")]  # the run says how it runs
    assert "layout sequential, world size 1" in how and "compile on" in how and record["env_key"] in how
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))  # the lock profiles carry tensorboard
    assert "acceptance length" in proc.stdout and "cache hits" in proc.stdout
    [row] = runs_json(train_env)
    assert row["name"] == "fg" and row["status"] == "finished" and row["step"] == 20
    assert row["acceptance_length"] is not None and row["cache_hits"] > 0


def test_polluted_venv_refuses_before_anything_starts(tmp_path, test_lock, wheelhouse, train_env):
    venv = tmp_path / "polluted"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--python", str(venv / "bin" / "python"),
                    "--no-index", "--find-links", str(wheelhouse), "sglang==0.0.1"], check=True, capture_output=True)
    proc = run_envkit("train", "--venv", str(venv), "--name", "bad", env=train_env)
    assert proc.returncode == 1
    assert "stray.known" in proc.stderr and "sglang" in proc.stderr and "nothing was started" in proc.stderr
    assert not (tmp_path / "runs" / "bad").exists()


def test_no_warm_refuses_a_cold_cache(cpu_venv, tmp_path):
    env = dict(os.environ, ENVKIT_CACHE_DIR=str(tmp_path / "cold"), ENVKIT_RUNS_DIR=str(tmp_path / "runs"))
    proc = run_envkit("train", "--venv", str(cpu_venv), "--no-warm", env=env)
    assert proc.returncode == 1 and "cold" in proc.stderr and "envkit warm-cache" in proc.stderr


def test_a_warning_stops_train_unless_allow_warn(cpu_venv, tmp_path):
    """PYTHONSTARTUP is a doctor warning (env.leak): train stops there, and with --allow-warn it goes on to the
    next step of preflight (here: a cold cache that --no-warm refuses)."""
    env = dict(os.environ, ENVKIT_CACHE_DIR=str(tmp_path / "cold"), ENVKIT_RUNS_DIR=str(tmp_path / "runs"),
               PYTHONSTARTUP=str(tmp_path / "startup.py"))
    stopped = run_envkit("train", "--venv", str(cpu_venv), "--no-warm", "--name", "w", env=env)
    assert stopped.returncode == 1 and "env.leak" in stopped.stderr and "--allow-warn" in stopped.stderr
    assert "cold" not in stopped.stderr
    allowed = run_envkit("train", "--venv", str(cpu_venv), "--no-warm", "--allow-warn", "--name", "w", env=env)
    assert allowed.returncode == 1 and "env.leak" not in allowed.stderr and "cold" in allowed.stderr


def test_detach_then_runs_shows_running_then_finished(cpu_venv, train_env, short_tiny, tmp_path):
    proc = run_envkit("train", "--venv", str(cpu_venv), "--config", short_tiny, "--name", "bg", "--detach", "--",
                      "--steps", "30", env=train_env)
    assert proc.returncode == 0, proc.stderr
    assert "follow:" in proc.stderr and "envkit logs bg -f" in proc.stderr
    assert runs_json(train_env)[0]["status"] in ("starting", "running")
    wait_for(lambda: runs_json(train_env)[0]["status"] not in ("starting", "running"), timeout=600,
             what="the detached run")
    assert runs_json(train_env)[0]["status"] == "finished"
    logs = run_envkit("logs", "bg", env=train_env, check=True)
    assert "done: walk tau" in logs.stdout


def test_sigterm_marks_the_run_and_leaves_a_loadable_checkpoint(cpu_venv, train_env, short_tiny, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "envkit", "train", "--venv", str(cpu_venv), "--config", short_tiny,
                             "--name", "term", "--", "--steps", "100000"], env=train_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "term" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and '"loss"' in metrics.read_text(), what="the first step")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    record = json.loads((tmp_path / "runs" / "term" / "run.json").read_text())
    assert record["status"] == "interrupted" and record["exit_code"] == 143
    check = subprocess.run([str(cpu_venv / "bin" / "python"), "-c",
                            "import sys, torch; s = torch.load(sys.argv[1], weights_only=True); print(s['step'])",
                            str(tmp_path / "runs" / "term" / "checkpoint.pt")], capture_output=True, text=True)
    assert check.returncode == 0 and int(check.stdout) >= 1


def test_envkit_train_refuses_trainer_flags_it_sets_itself(tmp_path):
    proc = run_envkit("train", "--venv", str(tmp_path / "nope"), "--", "--out", str(tmp_path / "elsewhere"))
    assert "set by envkit itself" in one_line_error(proc)
    proc = run_envkit("train", "--venv", str(tmp_path / "nope"), "--", "--out=x")
    assert "set by envkit itself" in one_line_error(proc)
    assert not (tmp_path / "elsewhere").exists()
