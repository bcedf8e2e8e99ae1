"""`envkit runs` and `envkit logs`: a run's state is always true, whatever its run dir holds (a dead launcher,
another host, a run.json of the wrong shape or depth, a hanging file), and tmux session names."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from helpers import assert_clean_error, fake_run, one_line_error, run_envkit, run_json, run_trainer


# -- run state is always true ------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


ESC = "\x1b"


def deeply_nested(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def test_a_starting_run_whose_launcher_died_is_lost_and_logs_end(tmp_path):
    run_dir = tmp_path / "runs" / "killed"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"name": "killed", "status": "starting", "launcher_pid": _dead_pid()}))
    (run_dir / "train.log").write_text("partial\n")
    [row] = run_json("runs")
    assert row["status"] == "lost"
    proc = run_envkit("logs", "killed", "-f", timeout=20)  # ends instead of following forever
    assert proc.returncode == 0 and "partial" in proc.stdout


def test_run_json_of_the_wrong_shape_and_bad_run_names(tmp_path):
    run_dir = tmp_path / "runs" / "listy"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text("[]")
    assert [(r["name"], r["status"]) for r in run_json("runs")] == [("listy", "invalid")]
    assert_clean_error(run_envkit("logs", "listy"), "not a run record")
    for name in ("x" * 300, "ends-in-a-newline\n"):  # `$` matched before a final newline; the rule is the whole name
        proc = run_envkit("train", "--name", name, "--venv", str(tmp_path / "nowhere"))
        assert_clean_error(proc, "run name")
        proc = run_envkit("run", "--name", name, "--venv", str(tmp_path / "nowhere"), "--", "true")
        assert_clean_error(proc, "run name")
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "runs" / "ends-in-a-newline\n").exists()


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux names are only sanitised where tmux is installed")
def test_tmux_session_names_survive_tmux_and_do_not_collide():
    from envkit.run.supervise import tmux_session_name

    name = tmux_session_name("run.v1:a")
    assert "." not in name and ":" not in name
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "sleep 30"], check=True)
    try:
        assert tmux_session_name("run.v1:a") == f"{name}-2"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={name}"], check=False)


def test_runs_lists_every_run_around_an_odd_or_hanging_run_json(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs / "good", "/nowhere", started_at="2026-01-01")
    (runs / "list").mkdir()
    (runs / "list" / "run.json").write_text("[1, 2]")
    fake_run(runs / "odd", "/nowhere", status=7, supervisor_pid="x", summary=[1], name=None)
    (runs / "fifo").mkdir()
    os.mkfifo(runs / "fifo" / "run.json")
    fake_run(runs / f"esc{ESC}[2Jname", "/nowhere", status=f"running{ESC}[31m")
    proc = subprocess.run([sys.executable, "-m", "envkit", "runs", "--runs-dir", str(runs)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert ESC not in proc.stdout
    names = [line.split()[0] for line in proc.stdout.splitlines()[1:]]
    assert {"good", "list", "odd", "fifo"} <= set(names)
    rows = json.loads(run_envkit("runs", "--runs-dir", str(runs), "--json").stdout)
    assert {r["name"]: r["status"] for r in rows}["list"] == "invalid"


def test_a_run_dir_from_another_host_is_not_running_here_and_logs_f_ends(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "copied"
    run_dir.mkdir(parents=True)
    # Its supervisor pid is alive here (this very process), but on that host it meant another process.
    (run_dir / "run.json").write_text(json.dumps({
        "name": "copied", "status": "running", "host": socket.gethostname() + "-elsewhere", "supervisor_pid": os.getpid(),
        "venv": "/nonexistent", "started_at": "2026-01-01T00:00:00+00:00"}))
    (run_dir / "train.log").write_text("step 1\n")
    listed = json.loads(run_envkit("runs", "--runs-dir", str(runs), "--json", check=True).stdout)
    assert [row["status"] for row in listed] == ["elsewhere"]
    proc = run_envkit("logs", "-f", "copied", "--runs-dir", str(runs), timeout=30)  # a hang fails by timeout
    assert proc.returncode == 0 and "step 1" in proc.stdout


# -- one Error: line, never a traceback ---------------------------------------------------------------------
@pytest.mark.e2e
def test_deeply_nested_json_is_data_not_a_traceback(tmp_path):
    runs = tmp_path / "runs"
    (runs / "deep").mkdir(parents=True)
    (runs / "deep" / "run.json").write_text(json.dumps({"name": "deep", "status": "finished"}))
    (runs / "deep" / "metrics.jsonl").write_text(deeply_nested() + "\n")
    proc = run_envkit("runs", "--runs-dir", str(runs))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "deep" in proc.stdout
    config = tmp_path / "c.json"
    config.write_text(deeply_nested())
    assert "--config" in one_line_error(run_trainer("train", "--config", str(config), "--out", str(tmp_path / "o")))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": list(range(40))}) + "\n" + deeply_nested() + "\n")
    error = one_line_error(run_trainer("train", "--preset", "tiny", "--data", str(data), "--steps", "1",
                                       "--out", str(tmp_path / "o2")))
    assert f"{data}:2" in error
