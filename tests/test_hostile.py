"""Trust under hostile input and careless use: crafted locks, data loss, kills at the worst moment,
false alarms, and tracebacks where a clear error belongs. Each case was reproduced against the code
before it was fixed; each test fails there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_envkit, run_json


def create_args(lock: Path, venv: Path, wheelhouse: Path, *extra: str) -> list[str]:
    return ["create", "--lock", str(lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse), *extra]


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 1) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("Error:") or "Error:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


# -- the lock is data --------------------------------------------------------------------------------
def test_injected_version_never_reaches_uv(tmp_path, test_lock, wheelhouse):
    text = test_lock.read_text()
    injected = text.replace('version = "1.0"', 'version = "1.0\\n--index-url http://127.0.0.1:9/simple"', 1)
    assert injected != text
    test_lock.write_text(injected)
    proc = run_envkit(*create_args(test_lock, tmp_path / "env", wheelhouse))
    assert_clean_error(proc, "is not a version")
    assert not (tmp_path / "env").exists()


def test_lock_cut_at_a_package_boundary_is_refused(tmp_path, test_lock, wheelhouse):
    text = test_lock.read_text()
    cut = text[: text.rindex("[[package]]")]  # valid TOML, one locked package short
    test_lock.write_text(cut)
    proc = run_envkit(*create_args(test_lock, tmp_path / "env", wheelhouse))
    assert_clean_error(proc, "has no [[package]] entry", "envkit lock")
    assert not (tmp_path / "env").exists()


def test_non_hex_hash_and_bad_names(tmp_path, test_lock, wheelhouse):
    text = test_lock.read_text()
    start = text.index('"sha256:') + len('"sha256:')
    test_lock.write_text(text[:start] + "zz" + text[start + 2:])
    assert_clean_error(run_envkit(*create_args(test_lock, tmp_path / "env", wheelhouse)), "64 hex digits")
    for name in ("", "../../x"):
        test_lock.write_text(text.replace('name = "ekt"', f"name = {json.dumps(name)}", 1))
        assert_clean_error(run_envkit("create", "--lock", str(test_lock), "--force"), "profile name")
    assert_clean_error(run_envkit("create", "--profile", "../../x"), "profile name")
    assert not (Path(os.environ["ENVKIT_HOME"]) / "venvs").exists()


# -- create never deletes what it did not make -----------------------------------------------------------
def test_force_never_deletes_a_users_directory_or_foreign_venv(tmp_path, test_lock, wheelhouse):
    data = tmp_path / "data"
    data.mkdir()
    (data / "precious.txt").write_text("keep me")
    assert_clean_error(run_envkit(*create_args(test_lock, data, wheelhouse, "--force")), "will not delete")
    assert (data / "precious.txt").read_text() == "keep me"
    foreign = tmp_path / "stdlib-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(foreign)], check=True)
    assert_clean_error(run_envkit(*create_args(test_lock, foreign, wheelhouse, "--force")), "did not make")
    assert (foreign / "pyvenv.cfg").exists()


def test_kill_between_the_two_renames_restores_the_old_venv(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)
    (venv / "marker").write_text("old venv")
    # The state a SIGKILL leaves between `rename(venv, old)` and `rename(temp, venv)`:
    os.rename(venv, tmp_path / ".env.old-deadbeef")
    result = run_json(*create_args(test_lock, venv, wheelhouse))
    assert result["action"] == "unchanged"  # the old venv is back, not deleted and rebuilt
    assert (venv / "marker").read_text() == "old venv"
    assert not list(tmp_path.glob(".env.old-*"))


def test_force_rebuild_swaps_and_leaves_nothing_behind(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)
    (venv / "marker").write_text("old venv")
    assert run_json(*create_args(test_lock, venv, wheelhouse, "--force"))["action"] == "rebuilt"
    assert not (venv / "marker").exists() and (venv / "envkit.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".env.")) == [".env.lock"]


def test_bad_venv_paths_are_errors_not_tracebacks(tmp_path, test_lock, wheelhouse):
    assert_clean_error(run_envkit(*create_args(test_lock, Path("/"), wheelhouse)), "cannot be a venv path")
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_clean_error(run_envkit(*create_args(test_lock, blocker / "env", wheelhouse)), "is a file, not a directory")


def test_damaged_venv_files_are_errors(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)
    (venv / "envkit.json").write_text("[1, 2]")
    proc = run_envkit("doctor", "--venv", str(venv))
    assert proc.returncode in (1, 2) and "not an envkit manifest" in proc.stderr and "Traceback" not in proc.stderr
    (venv / "envkit.json").unlink()
    (venv / "pyvenv.cfg").write_bytes(b"home = /usr\xff\xfe\n")
    proc = run_envkit("doctor", "--venv", str(venv))
    assert proc.returncode in (1, 2) and "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr


# -- false alarms ------------------------------------------------------------------------------------
def test_ld_preload_judged_by_what_the_library_is(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)

    def env_leaks(preload: str) -> list[dict]:
        proc = run_envkit("doctor", "--venv", str(venv), "--json", env=dict(os.environ, LD_PRELOAD=preload))
        return [f for f in json.loads(proc.stdout)["findings"] if f["id"] == "env.leak" and f["status"] != "ok"]

    assert env_leaks("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2") == []
    assert env_leaks("/opt/other/libtcmalloc_minimal.so.4 /usr/lib/libfoo.so") == []
    [leak] = env_leaks("/opt/cuda-12/lib64/libcudart.so.12")
    assert leak["status"] == "fail" and "libcudart" in leak["message"]


def test_find_links_urls_stay_urls(monkeypatch, tmp_path):
    from envkit import wheelhouse

    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "none.conf"))
    monkeypatch.setenv("PIP_FIND_LINKS", "https://wheels.example/simple file:///srv/wheels")
    monkeypatch.setenv("UV_FIND_LINKS", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    links = wheelhouse.find_links([], use_pip_config=True)
    assert "https://wheels.example/simple" in links and "file:///srv/wheels" in links
    assert str(tmp_path / "a") in links and str(tmp_path / "b") in links
    assert not any(link in ("https", "//wheels.example/simple", "file") for link in links)


# -- run state is always true ------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


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
    proc = run_envkit("train", "--name", "x" * 300, "--venv", str(tmp_path / "nowhere"))
    assert_clean_error(proc, "run name")
    assert not (tmp_path / "nowhere").exists()  # refused before any preflight


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
