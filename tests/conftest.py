"""Fixtures shared by every test: an isolated ENVKIT_HOME per test, and once per session the test wheelhouse,
the real cpu venv, a warm compile cache and a trained tiny run. Importable helpers are in helpers.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import (CODE_RUN_STEPS, EAGER, ONE_STEP, build_wheel, built_once, preset_args, run_envkit, run_trainer,
                     write_profile)

# `make test` runs three workers on two cores: one torch thread each, here and in every process a test starts
# (two-thread processes side by side on two cores spin waiting for each other's cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    """Inductor's C++ kernels through tools/g++, a compiler cache for this run (its docstring says why). The
    first process to configure (xdist's controller) makes the directory; the workers it starts inherit it."""
    if "ENVKIT_TEST_CXX_CACHE" in os.environ or "CXX" in os.environ:
        return  # a compiler the user chose, or the controller already set it up for this worker
    config.cxx_cache = tempfile.mkdtemp(prefix="envkit-tests-cxx-")
    os.environ["ENVKIT_TEST_CXX_CACHE"] = config.cxx_cache
    os.environ["CXX"] = str(Path(__file__).parent / "tools" / "g++")


def pytest_unconfigure(config):
    if getattr(config, "cxx_cache", None):
        shutil.rmtree(config.cxx_cache, ignore_errors=True)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own ENVKIT_HOME and runs dir; uv's package cache stays shared (it is a cache)."""
    monkeypatch.setenv("ENVKIT_HOME", str(tmp_path / "envkit-home"))
    monkeypatch.setenv("ENVKIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("ENVKIT_CACHE_DIR", str(tmp_path / "envkit-cache"))
    for name in ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "ENVKIT_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    """A local wheelhouse: a small dependency tree plus packages used to pollute venvs."""
    house = tmp_path_factory.mktemp("wheelhouse")
    build_wheel(house, "ekt-alpha", "1.0", requires=("ekt-beta>=1.0",))
    build_wheel(house, "ekt-beta", "1.0")
    build_wheel(house, "ekt-beta", "2.0")
    build_wheel(house, "ekt-gamma", "1.0")
    build_wheel(house, "sglang", "0.0.1")  # named like a catalog stray; tiny and harmless
    return house


@pytest.fixture
def test_lock(tmp_path, wheelhouse) -> Path:
    """A locked profile over the test wheelhouse (ekt-alpha and its dependency ekt-beta)."""
    path = write_profile(tmp_path / "ekt.toml", ["ekt-alpha==1.0", "ekt-beta==1.0"])
    run_envkit("lock", "--lock", str(path), "--no-index", "--find-links", str(wheelhouse), check=True)
    return path


@pytest.fixture(scope="session")
def warm_cache_root(tmp_path_factory, cpu_venv) -> Path:
    """One compile cache root warmed once per run for the tiny preset (the cold warm is the slow part), by two
    warmers started at once, as two users racing would: the warm lock makes one compile while the other waits
    and then only hits. Both `--json` outputs are kept in warmers.json (the first-warm and the lock's tests read
    them), so the run pays for one cold compile of the preset, not two."""
    def warm(root: Path) -> None:
        command = [sys.executable, "-m", "envkit", "warm-cache", "--venv", str(cpu_venv), "--json"]
        env = dict(os.environ, ENVKIT_CACHE_DIR=str(root))
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(2)]
        outputs = [proc.communicate(timeout=1200) for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], outputs
        (root / "warmers.json").write_text(json.dumps([json.loads(stdout) for stdout, _ in outputs]))
    return built_once(tmp_path_factory, "cache-root", warm)


@pytest.fixture(scope="session")
def cpu_venv(tmp_path_factory) -> Path:
    """The real `cpu` profile venv (torch, transformers), built once per run."""
    def create(home: Path) -> None:
        run_envkit("create", "--profile", "cpu", env=dict(os.environ, ENVKIT_HOME=str(home)), check=True, timeout=1200)
    return built_once(tmp_path_factory, "cpu-home", create) / "venvs" / "cpu"


def _run_env(tmp: Path) -> dict:
    return dict(os.environ, ENVKIT_CACHE_DIR=str(tmp / "cache"), ENVKIT_RUNS_DIR=str(tmp / "runs"),
                ENVKIT_HOME=str(tmp / "home"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, cpu_venv, warm_cache_root):
    """`envkit train --preset tiny` with its defaults, as the demo runs it: the drafter that gets served (and
    the trained drafter the random-target ablation reads)."""
    def train(tmp: Path) -> None:
        shutil.copytree(warm_cache_root, tmp / "cache", symlinks=True)
        proc = run_envkit("train", "--venv", str(cpu_venv), *preset_args(tmp, "tiny"), "--name", "tiny",
                          env=_run_env(tmp), timeout=1200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (tmp / "stdout.txt").write_text(proc.stdout)
    tmp = built_once(tmp_path_factory, "tiny-run", train)
    return tmp / "runs" / "tiny", _run_env(tmp), (tmp / "stdout.txt").read_text()


@pytest.fixture(scope="session")
def code_run(tmp_path_factory, cpu_venv):
    """`envkit train --preset code` in a home with no target yet: the first run builds code_tiny, which the serve
    tests then serve (one build for both)."""
    def train(tmp: Path) -> None:
        openings = tmp / "openings.jsonl"  # a second kind of traffic, walked and reported on its own at the end
        openings.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in
                                    ("def read_config(path):\n    with open(", "class Stack:\n    def push(self, item")))
        proc = run_envkit("train", "--venv", str(cpu_venv), *preset_args(tmp, "code"), "--name", "code", "--",
                          "--steps", str(CODE_RUN_STEPS), EAGER, "--walk-file", str(openings), env=_run_env(tmp),
                          timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (tmp / "output.txt").write_text(proc.stdout + proc.stderr)
    tmp = built_once(tmp_path_factory, "code-run", train)
    targets = list((tmp / "home" / "targets").glob("code_tiny-*"))
    assert len(targets) == 1, targets
    return tmp / "runs" / "code", _run_env(tmp), (tmp / "output.txt").read_text(), targets[0]


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "run")


def tiny_checkpoint(run_dir: Path) -> Path:
    pytest.importorskip("torch")
    from trainer.config.schema import tiny
    from trainer.train.loop import Trainer

    cfg = tiny()
    cfg.data.num_sequences, cfg.data.eval_sequences, cfg.data.buckets = 8, 2, [64]
    cfg.steps, cfg.compile = 1, False
    trainer = Trainer.sequential(cfg, run_dir, log=lambda m: None)
    return trainer.save_checkpoint()


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A one-step tiny run with its checkpoint (at its last step); tests copy it before they change it."""
    def train(tmp: Path) -> None:
        config = tmp / "config.json"
        config.write_text(json.dumps(ONE_STEP))
        proc = run_trainer("train", "--config", str(config), "--out", str(tmp / "run"))
        assert proc.returncode == 0, proc.stderr[-3000:]
    return built_once(tmp_path_factory, "finished-run", train) / "run"


@pytest.fixture(scope="session")
def serve_venv(tmp_path_factory) -> Path:
    """A serve venv made from the serve-cpu profile (`transformers serve`), built once per run. envkit's record of
    creating it lives in the state dir built beside it: pass `serve_state_env()` to commands that need it."""
    def create(root: Path) -> None:
        run_envkit("create", "--profile", "serve-cpu", "--venv", str(root / "venv"),
                   env=dict(os.environ, ENVKIT_CACHE_DIR=str(root / "cache")), check=True, timeout=900)
    return built_once(tmp_path_factory, "serve-venv", create)


# The long shared fixtures, each built by one worker from the start, side by side: a worker that needs a fixture
# the other is building waits idle (measured: ~4 of 28 worker-minutes). Only what the selected tests use.
PREBUILT_BY_WORKER = {"gw0": ("code_run",), "gw1": ("serve_venv", "tiny_run")}


@pytest.fixture(scope="session", autouse=True)
def _prebuilt(request):
    needed = {name for item in request.session.items for name in item.fixturenames}
    for name in PREBUILT_BY_WORKER.get(os.environ.get("PYTEST_XDIST_WORKER", ""), ()):
        if name in needed:
            request.getfixturevalue(name)


# A test's tier follows from what it needs: the session's cpu venv, warm cache or trained runs (a checkpoint
# included) make it e2e, a venv built from the test wheelhouse makes it integration; an explicit mark wins (a
# test that trains in a subprocess is marked e2e). The rest is the unit tier.
E2E_FIXTURES = {"cpu_venv", "warm_cache_root", "tiny_run", "code_run", "finished_run", "checkpoint_path"}
INTEGRATION_FIXTURES = {"wheelhouse", "test_lock"}


# Before xdist reads the groups (it names them in each test's id): the tests of the code preset share one
# module fixture that trains for three minutes, so they run on one worker, and first, while the other worker
# takes everything else. xdist hands tests out in the order run_order gives (bench/RESULTS.md, seventh session).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        for shared in ("code_run", "served_chat"):  # one worker builds it and runs every test that reads it
            if shared in item.fixturenames:
                item.add_marker(pytest.mark.xdist_group(shared))
        if item.get_closest_marker("e2e") or item.get_closest_marker("integration"):
            continue
        needs = set(item.fixturenames)
        if needs & E2E_FIXTURES:
            item.add_marker(pytest.mark.e2e)
        elif needs & INTEGRATION_FIXTURES:
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)
    items.sort(key=run_order)


def run_order(item) -> int:
    """The code preset's group; the integration tier while that worker builds the session's cpu venv; the
    tests of the trained tiny run, so the other worker builds it (with the warm cache) early rather than wait
    for it later; the other e2e tests; the unit tier's short tests last, so that neither worker finishes a
    minute-long test alone."""
    needs = set(item.fixturenames)
    if "code_run" in needs:
        return 0
    if item.get_closest_marker("integration"):
        return 1
    if "tiny_run" in needs:
        return 2
    return 3 if item.get_closest_marker("e2e") else 4
