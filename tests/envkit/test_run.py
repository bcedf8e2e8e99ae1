"""`envkit run -- COMMAND` as a user runs it: their own script, preflight, a run dir, a compile cache a second run
hits, tampering and pollution that stop it, a detached run; and Slurm's placement read from SLURM_* (two srun
nodes training together: test_scaleout.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envkit.errors import RunError
from envkit.run import slurm
from envkit.run.command import code_identity
from helpers import assert_clean_error, run_envkit

USER_SCRIPT = """\
import torch
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
step = torch.compile(model)
with torch.no_grad():
    print("out", float(step(torch.randn(8, 16)).square().mean()))
print("COUNTERS", {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")})
"""


def counters(log: str) -> dict:
    [line] = [line for line in log.splitlines() if line.startswith("COUNTERS ")]
    return eval(line.removeprefix("COUNTERS "), {})  # a dict literal the script printed


def record(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "run.json").read_text())


def test_a_users_script_runs_with_preflight_a_run_dir_and_a_cache_its_next_run_hits(cpu_venv, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_train.py").write_text(USER_SCRIPT)
    runs = tmp_path / "runs"
    first = run_envkit("run", "--venv", str(cpu_venv), "--name", "mine", "--", "python", "my_train.py", cwd=code)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "doctor" in first.stderr and "run mine: finished (exit 0)" in first.stderr
    assert counters(first.stdout)["fxgraph_cache_miss"] > 0
    made = record(runs, "mine")
    assert made["kind"] == "command" and made["status"] == "finished" and made["exit_code"] == 0
    assert made["command"][0] == str(cpu_venv / "bin" / "python") and made["cwd"] == str(code)
    assert Path(made["cache_dir"]).is_relative_to(Path(os.environ["ENVKIT_CACHE_DIR"]))
    assert made["code"]["key"].startswith("files:") and made["cache_fingerprint"]
    assert "COUNTERS" in (runs / "mine" / "train.log").read_text()

    second = run_envkit("run", "--venv", str(cpu_venv), "--name", "again", "--", "python", "my_train.py", cwd=code)
    assert second.returncode == 0, second.stderr[-3000:]
    hit = counters(second.stdout)
    assert hit.get("fxgraph_cache_hit", 0) > 0 and hit.get("fxgraph_cache_miss", 0) == 0, hit
    assert record(runs, "again")["env_key"] == made["env_key"]
    listed = {row["name"]: row["status"] for row in json.loads(run_envkit("runs", "--json", cwd=code).stdout)}
    assert listed == {"mine": "finished", "again": "finished"}

    # Edited code is another key: a cold cache of its own, the first one untouched.
    (code / "my_train.py").write_text(USER_SCRIPT + "# edited\n")
    edited = run_envkit("run", "--venv", str(cpu_venv), "--name", "edited", "--", "python", "my_train.py", cwd=code)
    assert edited.returncode == 0 and record(runs, "edited")["env_key"] != made["env_key"]

    # A cache entry changed after the fingerprint stops the next run before the command starts.
    entry = next(p for p in Path(made["cache_dir"]).rglob("*") if p.is_file() and p.name != "fingerprint.json")
    entry.write_bytes(entry.read_bytes() + b"#")
    (code / "my_train.py").write_text(USER_SCRIPT)
    tampered = run_envkit("run", "--venv", str(cpu_venv), "--name", "t", "--", "python", "my_train.py", cwd=code)
    assert tampered.returncode == 1 and "COUNTERS" not in tampered.stdout and not (runs / "t").exists()
    assert "tampering" in tampered.stderr and made["cache_dir"] in tampered.stderr
    assert "warm-cache" not in tampered.stderr  # a command's cache is rebuilt by its next run, not by warm-cache


def test_exit_codes_missing_commands_and_a_polluted_venv(test_lock, wheelhouse, tmp_path):
    venv = tmp_path / "venv"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    runs = tmp_path / "runs"
    failing = run_envkit("run", "--venv", str(venv), "--name", "three", "--",
                         "python", "-c", "import ekt_alpha, sys; print(ekt_alpha.VERSION); sys.exit(3)")
    assert failing.returncode == 3 and "1.0" in failing.stdout
    assert record(runs, "three")["exit_code"] == 3 and record(runs, "three")["status"] == "failed"

    missing = run_envkit("run", "--venv", str(venv), "--name", "none", "--", "no-such-program-here")
    assert missing.returncode == 1 and "command not found: 'no-such-program-here'" in missing.stderr
    assert not (runs / "none").exists()

    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--python", str(venv / "bin" / "python"), "--no-index",
                    "--find-links", str(wheelhouse), "sglang==0.0.1", "-q"], check=True)
    stopped = run_envkit("run", "--venv", str(venv), "--name", "dirty", "--", "python", "-c", "print('ran')")
    assert stopped.returncode == 1 and "doctor found problems" in stopped.stderr and "sglang" in stopped.stderr
    assert "ran" not in stopped.stdout and not (runs / "dirty").exists()


def test_detached_run_survives_its_terminal(test_lock, wheelhouse, tmp_path):
    venv = tmp_path / "venv"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    done = tmp_path / "done"
    proc = run_envkit("run", "--venv", str(venv), "--name", "bg", "--detach", "--", "python", "-c",
                      f"import time, pathlib; time.sleep(2); pathlib.Path({str(done)!r}).write_text('ok')")
    assert proc.returncode == 0 and "detached" in proc.stdout, proc.stderr  # the launching process has exited
    deadline = time.monotonic() + 60
    while record(tmp_path / "runs", "bg")["status"] in ("starting", "running") and time.monotonic() < deadline:
        time.sleep(0.3)
    assert record(tmp_path / "runs", "bg")["status"] == "finished" and done.read_text() == "ok"


def test_a_detached_run_gets_the_callers_environment_not_a_running_tmux_servers(test_lock, wheelhouse, tmp_path):
    """tmux starts a new session of a running server with that server's environment: the run must not."""
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed")
    venv = tmp_path / "venv"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    sockets = tmp_path / "tmux"
    sockets.mkdir()
    server_env = {key: value for key, value in os.environ.items() if not key.startswith("TMUX")}
    server_env["TMUX_TMPDIR"] = str(sockets)
    subprocess.run(["tmux", "new-session", "-d", "-s", "someone-elses", "sleep 600"], env=server_env, check=True)
    try:
        caller = dict(server_env, CUDA_VISIBLE_DEVICES="3", HF_HOME=str(tmp_path / "hf"), EKT_MARK="the caller's")
        seen = tmp_path / "seen.json"
        proc = run_envkit("run", "--venv", str(venv), "--name", "env", "--detach", "--", "python", "-c",
                          f"import json, os; open({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))", env=caller)
        assert proc.returncode == 0 and "tmux session" in proc.stderr, proc.stdout + proc.stderr
        deadline = time.monotonic() + 60
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        environ = json.loads(seen.read_text())
        assert environ["EKT_MARK"] == "the caller's" and environ["CUDA_VISIBLE_DEVICES"] == "3"
        assert environ["HF_HOME"] == str(tmp_path / "hf") and environ["VIRTUAL_ENV"] == str(venv)
        assert not list((tmp_path / "runs" / "env").glob(".environ*"))  # the hand-over leaves nothing behind
    finally:
        subprocess.run(["tmux", "kill-server"], env=server_env)


def test_code_identity_is_the_commit_plus_uncommitted_changes(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    clean = code_identity(repo, skip=(repo / "runs",))
    assert clean["commit"] and clean["uncommitted"] is None and clean["key"] == clean["commit"][:16]
    (repo / "runs").mkdir()
    (repo / "runs" / "out.log").write_text("a run's output is not code\n")
    assert code_identity(repo, skip=(repo / "runs",)) == clean
    (repo / "train.py").write_text("print(2)\n")
    edited = code_identity(repo, skip=(repo / "runs",))
    (repo / "helper.py").write_text("x = 1\n")
    untracked = code_identity(repo, skip=(repo / "runs",))
    assert len({clean["key"], edited["key"], untracked["key"]}) == 3 and edited["commit"] == clean["commit"]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "-c",
                    "protocol.file.allow=always", *args], check=True, capture_output=True)


def test_code_identity_covers_a_submodules_edits_and_what_a_symlink_points_at(tmp_path):
    """Edits the parent's `git diff` shows only as "-dirty" (inside a submodule), and edits to the file an untracked
    symlink points at, are other code: another key each, never a stale cache taken as this code's."""
    library = tmp_path / "library"
    library.mkdir()
    git(library, "init", "-q")
    (library / "layers.py").write_text("WIDTH = 1\n")
    git(library, "add", ".")
    git(library, "commit", "-qm", "lib")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("import lib.layers\n")
    git(repo, "submodule", "add", "-q", str(library), "lib")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    keys = [code_identity(repo)["key"]]
    for width in (2, 3):
        (repo / "lib" / "layers.py").write_text(f"WIDTH = {width}\n")
        keys.append(code_identity(repo)["key"])
    outside = tmp_path / "shared_config.py"
    outside.write_text("LR = 1\n")
    (repo / "config.py").symlink_to(outside)
    keys.append(code_identity(repo)["key"])
    outside.write_text("LR = 2\n")
    keys.append(code_identity(repo)["key"])
    assert len(set(keys)) == len(keys), keys
    plain = tmp_path / "plain"  # outside git: every *.py, links by their target's bytes
    plain.mkdir()
    (plain / "config.py").symlink_to(outside)
    before = code_identity(plain)["key"]
    outside.write_text("LR = 3\n")
    assert code_identity(plain)["key"] != before


def test_cache_variables_of_the_caller_are_named_and_replaced(test_lock, wheelhouse, tmp_path):
    """A remote, redirected or disabled compile cache would bypass the private, fingerprinted one: preflight names
    each such variable and the command sees envkit's values (SECURITY.md)."""
    venv = tmp_path / "venv"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    hostile = {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
               "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "theirs"), "TRITON_CACHE_DIR": str(tmp_path / "theirs-t"),
               "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "TORCHINDUCTOR_REDIS_HOST": "cache.example"}
    show = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))" % sorted(hostile)
    proc = run_envkit("run", "--venv", str(venv), "--name", "env", "--", "python", "-c", show,
                      env=dict(os.environ) | hostile)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    cache_dir = Path(record(tmp_path / "runs", "env")["cache_dir"])
    assert seen == {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
                    "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"), "TRITON_CACHE_DIR": str(cache_dir / "triton"),
                    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0", "TORCHINDUCTOR_REDIS_HOST": None}
    [note] = [line for line in proc.stderr.splitlines() if line.startswith("env: ")]
    assert all(name in note for name in hostile) and "cache.example" not in proc.stderr
    assert record(tmp_path / "runs", "env")["env_overridden"] == sorted(hostile)


def test_slurm_hostlists_expand_as_scontrol_does():
    assert slurm.expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert slurm.expand_hostlist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]
    assert slurm.expand_hostlist("127.0.0.[1-2]") == ["127.0.0.1", "127.0.0.2"]
    assert slurm.expand_hostlist("node9") == ["node9"]
    for bad in ("gpu[1-", "gpu[3-1]", "gpu[a-b]", "", "gpu[²-³]", "a]b", "n[[1]]"):
        with pytest.raises(RunError):
            slurm.expand_hostlist(bad)


def test_a_hostile_slurm_step_is_one_line_before_any_preflight(tmp_path):
    """Only the first host is used: a short list naming 10^10 hosts or 1,200 bracket groups is counted, never
    written out; counts in other Unicode digits are refused, not passed to int()."""
    step = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "2"}
    assert slurm.placement(step | {"SLURM_JOB_NODELIST": "n[0-99999]x[0-99999]"}).head == "n0x0"
    assert slurm.placement(step | {"SLURM_JOB_NODELIST": "n" + "[1-2]" * 1200}).head == "n" + "1" * 1200
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NODEID", "SLURM_NTASKS"):
        with pytest.raises(RunError, match=name):
            slurm.placement(step | {"SLURM_JOB_NODELIST": "n[1-2]", name: "²"})
    hostile = dict(os.environ) | step | {"SLURM_JOB_NODELIST": "n[0-99999]x[0-99999]", "SLURM_NNODES": "²",
                                         "SLURM_JOB_NUM_NODES": "١٢"}
    for command in (("run", "--venv", str(tmp_path / "nowhere"), "--", "true"),
                    ("train", "--venv", str(tmp_path / "nowhere"))):
        proc = run_envkit(*command, env=hostile, timeout=60)
        assert_clean_error(proc, "SLURM_JOB_NUM_NODES")
    assert not (tmp_path / "nowhere").exists()


def test_slurm_placement_is_derived_and_what_the_user_gives_wins():
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NODEID": "1", "SLURM_NTASKS": "2", "SLURM_GPUS_ON_NODE": "8"}
    assert slurm.launch_options(step) == {"nproc_per_node": 8, "nnodes": 2, "node_rank": 1,
                                          "rdzv_endpoint": "gpu07:29500", "rdzv_id": "slurm-77"}
    given = slurm.launch_options(step, nproc_per_node=4, rdzv_endpoint="head:1234", rdzv_port=9)
    assert given["nproc_per_node"] == 4 and given["rdzv_endpoint"] == "head:1234" and given["node_rank"] == 1
    assert slurm.run_name(step, None) == "slurm-77-node1" and slurm.run_name(step, "exp") == "exp-node1"
    assert slurm.placement_env(step, 29600) == {
        "MASTER_ADDR": "gpu07", "MASTER_PORT": "29600", "ENVKIT_NNODES": "2", "ENVKIT_NODE_RANK": "1",
        "ENVKIT_RDZV_ENDPOINT": "gpu07:29600", "ENVKIT_RDZV_ID": "slurm-77"}
    batch_script = {k: v for k, v in step.items() if k != "SLURM_STEP_ID"}  # sbatch's shell, not an srun step
    assert slurm.placement(batch_script) is None and slurm.run_name(batch_script, None) is None
    assert slurm.placement_env(batch_script) == {}
    with pytest.raises(RunError, match="one per node"):
        slurm.placement(step | {"SLURM_NTASKS": "16"})
