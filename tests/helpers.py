"""What every test file shares: where the project is, envkit and the trainer run as real processes, a lock
profile written from requirements, and tiny pure-Python wheels built on the spot (installs are real and need no
network). Fixtures live in conftest.py; everything importable lives here."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

PROJECT = Path(__file__).resolve().parent.parent  # tests/helpers.py -> the project


# The seed of every run a learned figure is read from (0: the presets as shipped). bench/learned_figures.py --seeds
# moves it: another machine's float rounding sends a target's and a drafter's training down another path, as another
# seed does, so the spread over seeds is the spread CI can meet (a fresh clone elsewhere read the recipe 2.25 / 1.90
# where every run here read 3.20 / 2.02).
TEST_SEED = int(os.environ.get("ENVKIT_TEST_SEED", "0"))


def record_figure(name: str, **values) -> None:
    """A learned figure as a test measured it, appended to $ENVKIT_TEST_FIGURES when that is set: the runs of
    bench/learned_figures.py collect the spread that each assertion's margin is chosen from (tests/README.md)."""
    path = os.environ.get("ENVKIT_TEST_FIGURES")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"figure": name, "seed": TEST_SEED, **values}) + "\n")


def seeded(config: dict) -> dict:
    """A run's config (a preset and its changes) with its seed at TEST_SEED, and its target's where the target is
    trained here (code_tiny): a random target's weights are drawn alike on every machine, a trained one's are not."""
    if not TEST_SEED:
        return config
    target = {"target": {**config.get("target", {}), "seed": TEST_SEED}} if config.get("preset") == "code" else {}
    return {**config, "seed": TEST_SEED, **target}


def preset_args(tmp: Path, preset: str) -> list[str]:
    """`--preset NAME` as a user passes it, or under a TEST_SEED a config file of that preset, seeded."""
    if not TEST_SEED:
        return ["--preset", preset]
    config = tmp / f"{preset}-seed{TEST_SEED}.json"
    config.write_text(json.dumps(seeded({"preset": preset})))
    return ["--config", str(config)]


def run_envkit(*args: str, env: dict | None = None, check: bool = False, timeout: float = 600,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """envkit as a user runs it: a real process."""
    proc = subprocess.run([sys.executable, "-m", "envkit", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"envkit {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_json(*args: str, **kwargs) -> dict:
    return json.loads(run_envkit(*args, "--json", **kwargs).stdout)


# The shared `code` preset run (conftest.py code_run): fewer steps than the preset's 1500 keep the suite short (its
# own figures are in bench/RESULTS.md). Eager: what is asserted there is the target and what the drafter learns
# from it; the compiled path is the tiny preset's to test, and a cold compile of this preset's two buckets would
# cost the suite more than it saves over 600 steps.
CODE_RUN_STEPS = 600
EAGER = "--no-compile"


# A one-step tiny run, compile off: the cheapest checkpoint (at its last step) a test can be handed.
ONE_STEP = {"preset": "tiny", "steps": 1, "compile": False, "eval_every": 0,
            "data": {"buckets": [64], "num_sequences": 8, "eval_sequences": 2}}


def run_trainer(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """`python -m trainer` as envkit starts it: a real process, from the project."""
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=PROJECT,
                          timeout=timeout, **kwargs)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The `Error:` line of a refused command, after checking it exited 1 without a traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert lines, proc.stderr[-2000:]
    return lines[0]


def write_profile(path: Path, requirements: list[str], name: str = "ekt") -> Path:
    path.write_text(
        "[profile]\n"
        f'name = "{name}"\n'
        'description = "test profile"\n'
        f'python = "{sys.version_info.major}.{sys.version_info.minor}"\n'
        f"requirements = {json.dumps(requirements)}\n"
    )
    return path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(dest: Path, name: str, version: str, *, requires: tuple[str, ...] = (),
                files: dict[str, str] | None = None) -> Path:
    """Write `name-version-py3-none-any.whl` with a module of the same name and a valid RECORD."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    contents = dict(files or {f"{module}/__init__.py": f"VERSION = {version!r}\n"})
    contents[f"{dist_info}/METADATA"] = "".join(
        ["Metadata-Version: 2.1\n", f"Name: {name}\n", f"Version: {version}\n"]
        + [f"Requires-Dist: {r}\n" for r in requires])
    contents[f"{dist_info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: envkit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{path},{_record_hash(text.encode())},{len(text.encode())}" for path, text in contents.items()]
    record.append(f"{dist_info}/RECORD,,")
    contents[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            # A fixed timestamp makes equal content give an equal wheel hash.
            archive.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return wheel


def plain_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "uv", "venv", str(path), "-q"], check=True)
    return path


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def fake_dist_info(venv: Path, folder: str, metadata: str | None, record: str = "") -> Path:
    dist_info = site_packages(venv) / folder
    dist_info.mkdir()
    if metadata is not None:
        (dist_info / "METADATA").write_text(metadata)
    (dist_info / "RECORD").write_text(record)
    return dist_info


def create_args(lock: Path, venv: Path, wheelhouse: Path, *extra: str) -> list[str]:
    return ["create", "--lock", str(lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse), *extra]


def booby_trapped_project(tmp_path: Path) -> tuple[Path, Path]:
    """A local project whose build writes a marker: if any tool builds it, code from the venv ran."""
    project, marker = tmp_path / "evil", tmp_path / "CODE-RAN"
    project.mkdir()
    (project / "setup.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                      "from setuptools import setup\nsetup(name='evil', version='1.0')\n")
    return project, marker


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 1) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("Error:") or "Error:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


def copy_root(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def fake_run(run_dir: Path, venv: str, **fields) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"name": run_dir.name, "status": "finished", "venv": venv, **fields}))
    (run_dir / "checkpoint.pt").write_bytes(b"not read before the venv is trusted")
    return run_dir


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory `name`, built by `build` once for the whole run. Under pytest-xdist (`make test` runs three
    workers) every worker's base temp shares one parent: the first worker to get here builds while the others
    wait on the lock, then all read the same directory (copy it before you write)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path, built = shared / name, shared / f"{name}.built"
    with FileLock(f"{path}.lock"):
        if not built.exists():
            shutil.rmtree(path, ignore_errors=True)  # a worker that failed half way leaves nothing to trust
            path.mkdir()
            build(path)
            built.touch()
    return path
