"""A mitigation is a checked fact: doctor trusts the self-test the venv ran, never a file's presence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import PROJECT, run_envkit

pytestmark = pytest.mark.e2e


def hazards(report: dict) -> dict[str, dict]:
    return {f["subject"]: f for f in report["findings"] if f["id"] == "torch.hazard"}


def project_copy(tmp_path: Path) -> Path:
    """This checkout's envkit, trainer and lock profiles in another place (run with cwd there)."""
    copy = tmp_path / "project"
    for part in ("envkit", "trainer", "lockfiles"):
        shutil.copytree(PROJECT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def sabotage_install(copy: Path) -> None:
    """threadsafe.install() that installs nothing but still says it did: the FX check stays process-global."""
    path = copy / "trainer" / "safety" / "threadsafe.py"
    source = path.read_text()
    marker = '        if hasattr(symbolic_trace, "_is_fx_tracing_flag"):'
    assert marker in source
    path.write_text(source.replace(marker, "        if False:  # sabotaged"))


def doctor(venv: Path, cwd: Path | None = None) -> tuple[int, dict]:
    proc = run_envkit("doctor", "--venv", str(venv), "--strict", "--json", cwd=cwd)
    return proc.returncode, json.loads(proc.stdout)


def test_a_sabotaged_mitigation_is_never_called_mitigated(cpu_venv, tmp_path):
    copy = project_copy(tmp_path)
    sabotage_install(copy)
    try:
        # Another trainer source: whatever this venv proved before does not vouch for it.
        code, report = doctor(cpu_venv, cwd=copy)
        assert code == 1
        found = hazards(report)
        assert found["H1"]["status"] == "warn" and "not verified" in found["H1"]["message"]
        assert "envkit warm-cache" in found["H1"]["fix"]
        assert not any("mitigated:" in f["message"] for f in found.values())

        proc = run_envkit("selftest", "--venv", str(cpu_venv), "--json", cwd=copy)
        assert proc.returncode == 1, proc.stderr
        results = json.loads(proc.stdout)["results"]
        assert not results["H1"]["passed"] and results["H1"]["reproduced"]
        assert "symbolically trace" in results["H1"]["detail"]
        assert results["H2"]["passed"]  # the compile gate was left intact

        code, report = doctor(cpu_venv, cwd=copy)
        found = hazards(report)
        assert code == 1 and found["H1"]["status"] == "fail" and "NOT mitigated" in found["H1"]["message"]
        assert found["H2"]["status"] == "ok"
    finally:
        # The intact trainer proves itself again, for the tests that share this venv.
        restored = run_envkit("selftest", "--venv", str(cpu_venv), "--json")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    code, report = doctor(cpu_venv)
    found = hazards(report)
    assert found["H1"]["status"] == "ok" and "compiled_call_under_foreign_trace passed" in found["H1"]["message"]
    assert all(f["status"] == "ok" for f in found.values()), found


def test_the_trainer_selftest_fails_outside_envkit_where_envkit_provides_the_mitigation(tmp_path):
    """H5 and H6 are envkit's part: run bare, without its private cache and lock, they do not pass; the
    trainer's own mitigations (H1-H4, H7, H8) pass, each after reproducing its failure stock where this torch has it."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "trainer", "selftest"], capture_output=True, text=True, cwd=PROJECT,
                          timeout=600)
    results = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    assert proc.returncode == 1
    assert not results["H5"]["passed"] and "default cache dir" in results["H5"]["detail"]
    assert not results["H6"]["passed"]
    assert all(results[h]["passed"] for h in ("H1", "H2", "H3", "H4", "H7", "H8")), results
    # The races themselves, in real threads: thread B symbolically traces a module whose forward blocks until
    # thread A made its call; stock torch fails A, the trainer's mitigation lets it run.
    assert results["H1"]["reproduced"] and "Detected that you are using FX to symbolically trace" in results["H1"]["detail"]
    assert results["H2"]["reproduced"] and "NameError: module is not installed as a submodule" in results["H2"]["detail"]
    assert results["H1"]["detail"].endswith("with install(): ok"), results["H1"]
    assert results["H2"]["detail"].endswith("under the compile gate: ok"), results["H2"]
