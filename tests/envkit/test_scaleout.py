"""More than one process and node, on CPU as a user runs it: torchrun through `envkit train`, two nodes
simulated on this machine (each its own ENVKIT_HOME and compile cache), placed by hand or by srun, a worker
SIGKILLed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_envkit

pytestmark = pytest.mark.e2e

FAST = {"preset": "tiny", "compile": False, "eval_every": 0, "ckpt_every": 5, "log_every": 5, "walk_prompts": 2,
        "walk_new_tokens": 16, "steps": 40, "data": {"buckets": [64], "num_sequences": 64, "eval_sequences": 2}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_env(tmp_path: Path, node: int, cache: Path | None = None) -> dict:
    """One simulated node: its own home, runs dir and compile cache; one thread so two nodes share two cores."""
    return dict(os.environ, ENVKIT_HOME=str(tmp_path / f"home{node}"), ENVKIT_RUNS_DIR=str(tmp_path / f"runs{node}"),
                ENVKIT_CACHE_DIR=str(cache or tmp_path / f"cache{node}"), OMP_NUM_THREADS="1")


def start_train(cpu_venv: Path, env: dict, *args: str) -> subprocess.Popen:
    """`envkit train` on one simulated node, as a background process."""
    return subprocess.Popen([sys.executable, "-m", "envkit", "train", "--venv", str(cpu_venv), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def start_nodes(cpu_venv: Path, tmp_path: Path, envs: list[dict], *args: str) -> list[subprocess.Popen]:
    """Two nodes placed by hand: every node option typed."""
    port = free_port()
    return [start_train(cpu_venv, env, "--name", "two", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
                        str(node), "--rdzv-endpoint", f"127.0.0.1:{port}", *args)
            for node, env in enumerate(envs)]


def finish(procs: list[subprocess.Popen]) -> list[tuple[str, str]]:
    outputs = [proc.communicate(timeout=900) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [(o[-2000:], e[-3000:]) for o, e in outputs]
    return outputs


def run_dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / f"runs{node}" / "two" for node in (0, 1)]


def writer_dir(tmp_path: Path) -> Path:
    """The run dir of the node where global rank 0 ran: the one with the summary."""
    [writer] = [d for d in run_dirs(tmp_path) if (d / "summary.json").exists()]
    return writer


def loss_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


def srun_env(tmp_path: Path, node: int, cache: Path | None = None) -> dict:
    """What `srun --nodes 2 --ntasks-per-node 1` gives task `node` (loopback hosts), its runs dir shared as on a
    shared file system."""
    return node_env(tmp_path, node, cache) | {
        "ENVKIT_RUNS_DIR": str(tmp_path / "runs"), "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "127.0.0.[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node), "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}


def test_two_srun_nodes_train_one_drafter_from_one_warm_cache(cpu_venv, warm_cache_root, tmp_path):
    """Two nodes as srun starts them, no node option typed: warm on one, `cache export`, `cache import --sha256`
    on the other; they meet at the first host, train one drafter, keep a run dir per node, and both hit."""
    cache0 = tmp_path / "cache0"
    shutil.copytree(warm_cache_root, cache0, symlinks=True)
    envs = [srun_env(tmp_path, 0, cache0), srun_env(tmp_path, 1)]
    bundle = tmp_path / "tiny.envkit-cache"
    exported = json.loads(run_envkit("cache", "export", str(bundle), "--venv", str(cpu_venv), "--json", env=envs[0],
                                     check=True).stdout)
    run_envkit("cache", "import", str(bundle), "--venv", str(cpu_venv), "--sha256", exported["sha256"],
               env=envs[1], check=True)
    # The tiny preset's shapes (they decide the cache key), with less data and a shorter walk.
    config = tmp_path / "short.json"
    config.write_text(json.dumps({"preset": "tiny", "walk_prompts": 2, "walk_new_tokens": 16, "eval_every": 0,
                                  "data": {"num_sequences": 64, "eval_sequences": 4}}))
    port = free_port()
    finish([start_train(cpu_venv, env, "--config", str(config), "--rdzv-port", str(port), "--", "--steps", "12")
            for env in envs])
    dirs = [tmp_path / "runs" / f"slurm-4242-node{node}" for node in (0, 1)]  # the job's name, one per node
    [writer] = [d for d in dirs if (d / "summary.json").exists()]
    summary = json.loads((writer / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["world_size"] == 2 and summary["restarts"] == 0
    assert loss_steps(writer) == list(range(1, 13))
    for run_dir in dirs:
        record = json.loads((run_dir / "run.json").read_text())
        assert record["status"] == "finished" and record["node"]["nnodes"] == 2
        assert record["node"]["writer"] == (run_dir == writer)
        assert f"127.0.0.1:{port}" in record["command"]  # the first host of the nodelist
        assert "warm-cache" not in record["preflight_s"]  # neither node compiled: the cache was warm on both
        [warmup] = [line for line in (run_dir / "train.log").read_text().splitlines() if "warm-up:" in line]
        assert "'fxgraph_cache_miss': 0" in warmup and "'fxgraph_cache_hit': 0" not in warmup, warmup
    assert summary["fxgraph_cache_miss"] == 0 and summary["fxgraph_cache_hit"] > 0  # summed over both ranks
    assert {json.loads((d / "run.json").read_text())["node"]["group_rank"] for d in dirs} == {0, 1}


def worker_pid(runs_dir: Path) -> int:
    """The torchrun worker (LOCAL_RANK set) of the node whose runs dir is `runs_dir`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (b"trainer\0train" in cmdline and f"ENVKIT_RUNS_DIR={runs_dir}".encode() in environ
                and any(item.startswith(b"LOCAL_RANK=") for item in environ)):
            return int(entry.name)
    raise AssertionError(f"no worker of {runs_dir}")


def wait_for_checkpoint(tmp_path: Path, steps: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for run_dir in run_dirs(tmp_path):
            if (run_dir / "checkpoint.pt").exists() and (run_dir / "metrics.jsonl").exists() \
                    and len(loss_steps(run_dir)) >= steps:
                return
        time.sleep(0.05)
    raise AssertionError("no checkpoint was written")


def test_a_sigkilled_worker_restarts_resumes_and_finishes(cpu_venv, tmp_path):
    config = tmp_path / "fast.json"
    config.write_text(json.dumps(FAST))
    envs = [node_env(tmp_path, node) for node in (0, 1)]
    procs = start_nodes(cpu_venv, tmp_path, envs, "--config", str(config), "--max-restarts", "2")
    wait_for_checkpoint(tmp_path, 12)  # after the checkpoint of step 10
    os.kill(worker_pid(tmp_path / "runs1"), signal.SIGKILL)
    finish(procs)
    writer = writer_dir(tmp_path)
    summary = json.loads((writer / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["restarts"] == 1 and summary["world_size"] == 2
    steps = loss_steps(writer)
    redone = [step for index, step in enumerate(steps) if index and step <= steps[index - 1]]
    assert redone and steps[-1] == 40 and set(range(1, 41)) <= set(steps)  # every step done, some twice
    assert redone[0] % FAST["ckpt_every"] == 1  # redone from the step after a checkpoint
    for run_dir in run_dirs(tmp_path):
        assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_without_restarts_a_dead_worker_fails_the_run_naming_it(cpu_venv, tmp_path):
    config = tmp_path / "fast.json"
    config.write_text(json.dumps(FAST | {"steps": 100000}))
    env = node_env(tmp_path, 0)
    proc = subprocess.Popen([sys.executable, "-m", "envkit", "train", "--venv", str(cpu_venv), "--name", "two",
                             "--config", str(config), "--nproc-per-node", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    run_dir = tmp_path / "runs0" / "two"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not ((run_dir / "metrics.jsonl").exists() and len(loss_steps(run_dir)) >= 3):
        time.sleep(0.05)
    victims = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
               if _is_rank(pid, run_dir.parent, rank=1)]
    assert victims
    os.kill(victims[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stderr[-2000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed"
    assert "worker rank 1" in record["error"] and "-9" in record["error"], record["error"]
    assert "worker rank 1" in stdout


def _is_rank(pid: int, runs_dir: Path, rank: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return (b"trainer\0train" in cmdline and f"ENVKIT_RUNS_DIR={runs_dir}".encode() in environ
            and f"RANK={rank}".encode() in environ)
