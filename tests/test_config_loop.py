"""One resolved config, stops at step boundaries, results as files, checkpoints that cannot run code."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_envkit

torch = pytest.importorskip("torch")

from trainer import checkpoint  # noqa: E402
from trainer.config import resolve, tiny  # noqa: E402

PROJECT = Path(__file__).resolve().parent.parent


def trainer(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=PROJECT,
                          timeout=600, **kwargs)


def test_config_resolution_order_and_partial_files():
    assert resolve(None, {"preset": "tiny"}).to_dict() == tiny().to_dict()  # a preset, not the dataclass defaults
    cfg = resolve("tiny", {"steps": 5, "data": {"buckets": [64]}}, {"batch_size": 4, "steps": 7})
    assert (cfg.steps, cfg.batch_size, cfg.data.buckets, cfg.drafter.block_size) == (7, 4, [64], 8)
    full = resolve(None, cfg.to_dict())  # a run's config.json resolves to itself
    assert full.to_dict() == cfg.to_dict()


@pytest.mark.parametrize("config, needle", [
    ({"stepz": 3}, "unknown config key 'stepz'"),
    ({"data": {"sourc": "random"}}, "unknown config key data.sourc"),
    ({"data": {"source": "web"}}, "data.source must be generate, corpus, random or chat_lengths"),
    ({"dtype": "fp8"}, "dtype must be float32, bfloat16 or float16"),
])
def test_bad_config_names_the_key(tmp_path, config, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    proc = trainer("describe", "--config", str(path))
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_checkpoints_never_unpickle_code(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 1, "payload": os.system}, path)  # a callable is pickled by reference: code on load
    with pytest.raises(Exception, match="[Ww]eights only"):
        checkpoint.load(path)


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


SMALL = {"preset": "tiny", "data": {"num_sequences": 32, "eval_sequences": 4}, "walk_prompts": 2,
         "walk_new_tokens": 16, "eval_every": 0}


def _rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of torchrun's worker with LOCAL_RANK=rank."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher_pid and f"LOCAL_RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no rank {rank} under pid {launcher_pid}")


TRAINER = (sys.executable, "-m", "trainer")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "trainer")
# What `--gpus 2` runs, without needing two CUDA devices: the trainer starts torchrun itself, ranks on CPU with gloo.
LAUNCHER = (sys.executable, "-m", "trainer")
LAUNCHER_ARGS = ("--nproc-per-node", "2")


def _stop_mid_run(out: Path, *extra: str, command: tuple[str, ...] = TRAINER, rank: int | None = None):
    """SIGTERM after three logged steps: to the command, or to one torchrun rank only."""
    proc = subprocess.Popen([*command, "train", "--out", str(out), "--steps", "100000", "--no-compile", *extra],
                            cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").exists() and sum('"loss"' in line for line in
                                                    (out / "metrics.jsonl").read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    os.kill(proc.pid if rank is None else _rank_pid(proc.pid, rank), signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("layout", [(), ("--targets", "cpu", "--drafters", "cpu,cpu")], ids=["sequential", "threads"])
def test_sigterm_stops_at_a_step_boundary_and_resume_is_exact(tmp_path, layout):
    out = tmp_path / "run"
    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    layout = ("--config", str(tmp_path / "small.json"), *layout)
    proc = _stop_mid_run(out, *layout)
    assert proc.returncode == 143, proc.stderr[-2000:]
    state = checkpoint.load(out / "checkpoint.pt")
    steps = [row["step"] for row in _metrics(out) if "loss" in row]
    # The checkpoint holds exactly the steps whose rows were written: none half-applied, none lost.
    assert steps == list(range(1, state["step"] + 1))
    assert f"interrupted at step {state['step']}" in proc.stdout
    if "--drafters" in layout:
        assert "replicas identical: True" in proc.stdout
    resumed = trainer("train", "--out", str(out), "--steps", str(state["step"] + 2), "--no-compile", "--resume",
                      *layout)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    steps = [row["step"] for row in _metrics(out) if "loss" in row]
    assert steps == list(range(1, state["step"] + 3))  # continues with the next step, none re-trained
    assert json.loads((out / "summary.json").read_text())["steps"] == state["step"] + 2


@pytest.mark.slow
@pytest.mark.parametrize("command,rank,extra", [(TORCHRUN, 1, ()), (LAUNCHER, None, LAUNCHER_ARGS)],
                         ids=["torchrun, one rank", "--nproc-per-node"])
def test_ranks_stop_after_the_same_step(tmp_path, command, rank, extra):
    """SIGTERM to one torchrun rank only, or to the trainer that started torchrun (which hands it to every rank): the
    ranks agree on the step to stop after, so none waits in an all-reduce for a partner that has left,
    and rank 0 checkpoints exactly the steps it logged."""
    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    out = tmp_path / "run"
    proc = _stop_mid_run(out, "--config", str(tmp_path / "small.json"), *extra, command=command, rank=rank)
    stopped = [line for line in proc.stdout.splitlines() if line.startswith("interrupted at step")]
    assert len(stopped) == 2, proc.stdout + proc.stderr[-3000:]
    assert len({line.split()[3] for line in stopped}) == 1, stopped  # the same step on both ranks
    state = checkpoint.load(out / "checkpoint.pt")
    assert [row["step"] for row in _metrics(out) if "loss" in row] == list(range(1, state["step"] + 1))
    if command is LAUNCHER:
        assert proc.returncode == 143, proc.stderr[-2000:]


@pytest.mark.slow
def test_trainer_arguments_reach_warm_up_and_run_json(cpu_venv, warm_cache_root, tmp_path):
    root = tmp_path / "cache-root"
    shutil.copytree(warm_cache_root, root, symlinks=True)
    env = dict(os.environ, ENVKIT_CACHE_DIR=str(root), ENVKIT_RUNS_DIR=str(tmp_path / "runs"))
    # One bucket and a short evaluation: the cold warm-up for batch 4 is the test, not two buckets of it.
    config = tmp_path / "one-bucket.json"
    config.write_text(json.dumps({"preset": "tiny", "walk_prompts": 2, "walk_new_tokens": 16,
                                  "data": {"buckets": [64], "num_sequences": 64, "eval_sequences": 4}}))
    proc = run_envkit("train", "--venv", str(cpu_venv), "--config", str(config), "--name", "b4", "--",
                      "--batch-size", "4", "--steps", "3", env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "b4"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["config"]["batch_size"] == 4
    assert json.loads((run_dir / "config.json").read_text())["batch_size"] == 4
    assert "--config" in record["command"] and str(run_dir / "config.json") in record["command"]
    # Warmed for batch 4 by this very command: the run itself only hits.
    assert record["summary"]["fxgraph_cache_miss"] == 0 and record["summary"]["fxgraph_cache_hit"] > 0
    assert record["summary"] == json.loads((run_dir / "summary.json").read_text())
