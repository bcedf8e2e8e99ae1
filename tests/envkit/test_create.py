from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envkit.lock import profile as profiles
from helpers import assert_clean_error, build_wheel, create_args, run_envkit, run_json, write_profile


def venv_import(venv: Path, module: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", f"import {module}; print({module}.VERSION)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def leftovers(parent: Path, venv: Path) -> list[str]:
    return sorted(p.name for p in parent.glob(f".{venv.name}.*") if not p.name.endswith(".lock"))


def test_create_then_noop_then_force(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    first = run_json(*create_args(test_lock, venv, wheelhouse))
    assert first["action"] == "created" and first["packages"] == 2
    assert venv_import(venv, "ekt_alpha") == "1.0" and venv_import(venv, "ekt_beta") == "1.0"
    manifest = json.loads((venv / "envkit.json").read_text())
    assert manifest["lock_digest"] == profiles.load_file(test_lock).lock_digest
    assert {"profile", "python", "envkit_version", "uv_version", "created_at"} <= manifest.keys()

    again = run_json(*create_args(test_lock, venv, wheelhouse))
    assert again["action"] == "unchanged"
    assert json.loads((venv / "envkit.json").read_text())["created_at"] == manifest["created_at"]

    forced = run_json(*create_args(test_lock, venv, wheelhouse, "--force"))
    assert forced["action"] == "rebuilt"
    assert leftovers(tmp_path, venv) == []


def test_drifted_venv_is_rebuilt_without_force(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--python", str(venv / "bin" / "python"),
                    "--no-index", "--find-links", str(wheelhouse), "ekt-beta==2.0"], check=True, capture_output=True)
    assert run_json(*create_args(test_lock, venv, wheelhouse))["action"] == "rebuilt"
    assert venv_import(venv, "ekt_beta") == "1.0"


def test_progress_lines_on_stderr(tmp_path, test_lock, wheelhouse):
    proc = run_envkit(*create_args(test_lock, tmp_path / "env", wheelhouse), check=True)
    assert "[1/4] venv" in proc.stderr and "[2/4] install" in proc.stderr and "[4/4] done" in proc.stderr
    assert proc.stdout.startswith("created:")


def test_hash_mismatch_names_package_and_keeps_old_venv(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)
    # A wheelhouse whose ekt-beta 1.0 has other content than the one that was locked.
    tampered = tmp_path / "tampered"
    build_wheel(tampered, "ekt-alpha", "1.0", requires=("ekt-beta>=1.0",))
    build_wheel(tampered, "ekt-beta", "1.0", files={"ekt_beta/__init__.py": "VERSION = 'evil'\n"})
    proc = run_envkit(*create_args(test_lock, venv, tampered, "--force"), env=dict(os.environ, UV_CACHE_DIR=str(tmp_path / "uvc")))
    assert proc.returncode == 1
    assert "hash mismatch for ekt-beta" in proc.stderr and "sha256:" in proc.stderr
    assert venv_import(venv, "ekt_beta") == "1.0"
    assert leftovers(tmp_path, venv) == []


def test_package_no_source_has(tmp_path, test_lock):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_envkit(*create_args(test_lock, tmp_path / "env", empty))
    assert proc.returncode == 1
    assert "ekt-" in proc.stderr and "--find-links" in proc.stderr
    assert not (tmp_path / "env").exists() and leftovers(tmp_path, tmp_path / "env") == []


def test_unavailable_interpreter(tmp_path, test_lock, wheelhouse):
    test_lock.write_text(test_lock.read_text().replace(f'python = "{sys.version_info.major}.{sys.version_info.minor}"',
                                                       'python = "3.4"'))
    proc = run_envkit(*create_args(test_lock, tmp_path / "env", wheelhouse, "--offline"))
    assert proc.returncode == 1 and "interpreter" in proc.stderr


def test_refuses_foreign_directory(tmp_path, test_lock, wheelhouse):
    foreign = tmp_path / "data"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    proc = run_envkit(*create_args(test_lock, foreign, wheelhouse))
    assert proc.returncode == 1 and "--force" in proc.stderr
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_concurrent_creates_serialise(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    procs = [subprocess.Popen([sys.executable, "-m", "envkit", *create_args(test_lock, venv, wheelhouse, "--json")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    actions = sorted(json.loads(out)["action"] for out, _ in results)
    assert actions == ["created", "unchanged"]
    assert venv_import(venv, "ekt_alpha") == "1.0"
    assert leftovers(tmp_path, venv) == []


def _killed_rebuild(tmp_path, lock, venv, wheelhouse, sig) -> str:
    """A forced rebuild signalled once its new venv exists, and the manifest it would have replaced. The two tiny
    wheels install in milliseconds: on a loaded machine the whole rebuild can finish between two polls, so one that
    finished before the signal landed (exit 0, a new venv in place) is tried again with another cold uv cache."""
    for attempt in range(5):
        manifest = (venv / "envkit.json").read_text()
        proc = subprocess.Popen([sys.executable, "-m", "envkit", *create_args(lock, venv, wheelhouse, "--force")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, UV_CACHE_DIR=str(tmp_path / f"cold-uv-cache-{attempt}")))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list(tmp_path.glob(f".{venv.name}.tmp-*/venv/lib/python3*/site-packages")):
                break
            time.sleep(0.001)
        else:
            pytest.fail("the rebuild never reached the install phase")
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        if proc.returncode != 0:
            return manifest
    pytest.fail("five rebuilds finished before the signal reached them")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_rebuild_leaves_old_venv_working(tmp_path, test_lock, wheelhouse, sig):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)
    manifest = _killed_rebuild(tmp_path, test_lock, venv, wheelhouse, sig)
    assert venv_import(venv, "ekt_alpha") == "1.0"
    assert (venv / "envkit.json").read_text() == manifest
    if sig == signal.SIGTERM:
        assert leftovers(tmp_path, venv) == []  # cleaned on the way out
    # The next create cleans whatever a SIGKILL left and finds the venv current.
    assert run_json(*create_args(test_lock, venv, wheelhouse))["action"] == "unchanged"
    assert leftovers(tmp_path, venv) == []


def test_relocated_scripts_work(tmp_path, wheelhouse):
    """Console scripts keep working after the temp dir is renamed into place."""
    build_wheel(wheelhouse, "ekt-tool", "1.0", files={"ekt_tool/__init__.py": "def main():\n    print('tool ok')\n"})
    from helpers import write_profile

    lock = write_profile(tmp_path / "tool.toml", ["ekt-tool==1.0"])
    run_envkit("lock", "--lock", str(lock), "--no-index", "--find-links", str(wheelhouse), check=True)
    venv = tmp_path / "env"
    run_envkit(*create_args(lock, venv, wheelhouse), check=True)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import ekt_tool; ekt_tool.main()"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "tool ok"
    assert not any(str(tmp_path / f".{venv.name}.tmp") in p.read_text(errors="replace")
                   for p in (venv / "bin").iterdir() if p.is_file())


@pytest.mark.e2e
def test_real_cpu_profile_imports_torch_and_transformers(cpu_venv):
    code = "import torch, transformers; print(torch.__version__, transformers.__version__)"
    out = subprocess.run([str(cpu_venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["2.13.0+cpu", "5.6.0"]
    assert subprocess.run([str(cpu_venv / "bin" / "torchrun"), "--help"], capture_output=True).returncode == 0


def test_pip_conf_find_links_is_a_wheelhouse(tmp_path, wheelhouse, monkeypatch):
    """A cluster that configures pip, not uv: create finds the wheelhouse through pip's own config file."""
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {wheelhouse}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    lock = write_profile(tmp_path / "p.toml", ["ekt-gamma==1.0"])
    run_envkit("lock", "--lock", str(lock), "--no-index", check=True)  # no --find-links anywhere
    result = run_json("create", "--lock", str(lock), "--venv", str(tmp_path / "venv"), "--no-index", check=True)
    assert result["action"] == "created" and result["packages"] == 1
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "empty.conf"))
    proc = run_envkit("create", "--lock", str(lock), "--venv", str(tmp_path / "venv2"), "--no-index")
    assert proc.returncode == 1 and "ekt-gamma" in proc.stderr  # without the config, no source has it


def test_a_wheelhouse_torch_is_the_source_of_torch(tmp_path, monkeypatch):
    """With torch in a wheelhouse, the profile's torch-backend is not passed to uv (which would ignore the
    wheelhouse for torch) and the wheelhouse's torch is what gets installed."""
    from envkit.lock.resolve import source_args
    from envkit.lock.profile import load_file

    house = tmp_path / "house"
    house.mkdir()
    build_wheel(house, "torch", "2.13.0")  # a stand-in: a wheel named torch, nothing of torch in it
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    lock = write_profile(tmp_path / "t.toml", ["torch==2.13.0"], name="t")
    lock.write_text(lock.read_text().replace("[profile]\n", '[profile]\ntorch-backend = "cu130"\n'))
    run_envkit("lock", "--lock", str(lock), "--no-index", "--find-links", str(house), check=True)
    profile = load_file(lock)
    assert "--torch-backend" in source_args(profile, [], offline=False, no_index=True)
    assert "--torch-backend" not in source_args(profile, [str(house)], offline=False, no_index=True)
    venv = tmp_path / "venv"
    run_envkit(*create_args(lock, venv, house), check=True)
    assert (next((venv / "lib").glob("python3*/site-packages")) / "torch" / "__init__.py").read_text() == \
        "VERSION = '2.13.0'\n"


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


def test_find_links_urls_stay_urls(monkeypatch, tmp_path):
    from envkit.lock import wheelhouse

    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "none.conf"))
    monkeypatch.setenv("PIP_FIND_LINKS", "https://wheels.example/simple file:///srv/wheels")
    monkeypatch.setenv("UV_FIND_LINKS", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    links = wheelhouse.find_links([], use_pip_config=True)
    assert "https://wheels.example/simple" in links and "file:///srv/wheels" in links
    assert str(tmp_path / "a") in links and str(tmp_path / "b") in links
    assert not any(link in ("https", "//wheels.example/simple", "file") for link in links)


def test_create_leaves_siblings_it_did_not_make(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    args = ("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse))
    foreign = [tmp_path / ".env.tmp-mine", tmp_path / ".env.old-mine"]
    for path in foreign:
        path.mkdir()
        (path / "data.txt").write_text("a user's")
    run_envkit(*args, check=True)  # fresh: the path was free, yet a user's .env.old-* must not be moved there
    assert not (venv / "data.txt").exists()
    run_envkit(*args, check=True)  # a no-op create
    assert all((path / "data.txt").read_text() == "a user's" for path in foreign)
