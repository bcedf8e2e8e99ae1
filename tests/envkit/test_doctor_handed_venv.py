"""doctor on a venv someone handed over: nothing the venv says about itself is proof.

Each case plants a real payload: start-up code that would write a marker file, a decoy
site-packages, an interpreter that is a script, a lock or self-test record of the venv's own
choosing, a stat index someone else could write, FIFOs where doctor reads. doctor must report each
(or ignore the claim) without running anything from the venv and without hanging.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fake_dist_info, plain_venv, run_envkit, site_packages, write_profile


def own_site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def doctor_json(venv: Path, *args: str, env=None) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run_envkit("doctor", "--venv", str(venv), "--json", *args, env=env, timeout=60)
    return proc, json.loads(proc.stdout)


def failing(report: dict, check_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["id"] == check_id and f["status"] == "fail"]


def test_start_up_code_outside_any_record_is_reported_and_never_run(tmp_path):
    venv = plain_venv(tmp_path / "v")
    marker = tmp_path / "CODE-RAN"
    (own_site_packages(venv) / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    proc, report = doctor_json(venv)
    assert proc.returncode == 1
    [finding] = failing(report, "site.startup")
    assert finding["subject"] == "sitecustomize.py" and "rm -r" in finding["fix"]
    # train stops at doctor: its first step that runs anything in the venv comes after.
    train = run_envkit("train", "--venv", str(venv), "--no-warm", timeout=120)
    assert train.returncode == 1 and "site.startup" in train.stderr + train.stdout
    assert not marker.exists()


def test_a_decoy_site_packages_is_flagged_and_the_real_one_is_read(tmp_path, wheelhouse):
    venv = plain_venv(tmp_path / "v")
    # The interpreter loads lib/python3.X; a decoy lib/python3.0 sorts first (the old doctor read it).
    decoy = venv / "lib" / "python3.0" / "site-packages"
    decoy.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    "--no-index", "--find-links", str(wheelhouse), "sglang==0.0.1"], check=True)
    proc, report = doctor_json(venv)
    assert proc.returncode == 1
    assert [f["subject"] for f in failing(report, "venv.site-packages")] == ["lib/python3.0/site-packages"]
    assert any(f["subject"] == "sglang" for f in report["findings"] if f["id"] == "stray.known")


@pytest.mark.parametrize("kind", ["script", "other-binary"])
def test_an_interpreter_that_is_not_pyvenv_homes_is_reported(tmp_path, kind):
    venv = plain_venv(tmp_path / "v")
    marker = tmp_path / "CODE-RAN"
    python = venv / "bin" / "python"
    python.unlink()
    if kind == "script":
        python.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
        python.chmod(0o755)
    else:
        python.symlink_to(shutil.which("sh"))  # a real binary, not the interpreter pyvenv.cfg's home names
    proc, report = doctor_json(venv)
    assert proc.returncode == 1
    assert "bin/python" in [f["subject"] for f in failing(report, "venv.interpreter")]
    assert not marker.exists()


def test_a_venvs_own_choice_of_lock_never_blesses_its_strays(tmp_path, wheelhouse, test_lock):
    venv = tmp_path / "made"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    # envkit recorded the lock it built this venv from: doctor uses it without --lock.
    proc, report = doctor_json(venv)
    assert proc.returncode == 0 and report["profile"] == "ekt", proc.stdout[-2000:]
    # Someone installs a stray and rewrites envkit.json to name a lock that lists it.
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    "--no-index", "--find-links", str(wheelhouse), "ekt-gamma==1.0"], check=True)
    blessing = write_profile(tmp_path / "blessing.toml", ["ekt-alpha==1.0", "ekt-beta==1.0", "ekt-gamma==1.0"])
    run_envkit("lock", "--lock", str(blessing), "--no-index", "--find-links", str(wheelhouse), check=True)
    handed = tmp_path / "handed"
    shutil.copytree(venv, handed, symlinks=True)  # a copy: envkit never recorded creating it
    manifest = json.loads((handed / "envkit.json").read_text())
    (handed / "envkit.json").write_text(json.dumps(manifest | {"lock_path": str(blessing), "profile": "blessing"}))
    proc, report = doctor_json(handed)
    assert proc.returncode == 1
    [refused] = failing(report, "lock.untrusted")
    assert str(blessing) in refused["message"] and "--lock" in refused["fix"]
    # The user may still choose that lock, by naming it.
    proc, report = doctor_json(handed, "--lock", str(blessing))
    assert not failing(report, "lock.untrusted") and not failing(report, "lock.extra")


def fake_torch(venv: Path) -> None:
    """A torch that doctor's hazard checks see (H4's source line) with a RECORD, and nothing importable."""
    site = own_site_packages(venv)
    (site / "torch" / "_dynamo").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.13.0+cpu'\ncuda = None\n")
    (site / "torch" / "_dynamo" / "config.py").write_text("recompile_limit = 8\n")
    dist_info = site / "torch-2.13.0+cpu.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    (dist_info / "RECORD").write_text("torch/version.py,,\n")


def hazard_statuses(venv: Path) -> dict[str, str]:
    _proc, report = doctor_json(venv)
    return {f["subject"]: f["status"] for f in report["findings"] if f["id"] == "torch.hazard"}


def test_a_self_test_record_counts_only_where_envkit_wrote_it_for_this_venv(tmp_path):
    from envkit.trainerproc import hazard_proof as selftest
    from envkit.support import state
    from envkit.venv.managed import Venv
    from trainer.common.mitigations import MITIGATIONS

    venv = plain_venv(tmp_path / "v")
    fake_torch(venv)
    digest = __import__("envkit.trainerproc.source", fromlist=["trainer_digest"]).trainer_digest()
    results = {h: {"passed": True, "selftest": "x", "detail": "forged"} for h in MITIGATIONS}
    forged = {"torch": "2.13.0+cpu", "trainer": digest, "results": results}
    # A record the venv carries (the old place) proves nothing.
    (venv / "envkit-selftest.json").write_text(json.dumps(forged))
    assert hazard_statuses(venv)["H4"] == "warn"
    # envkit's record for this venv counts...
    state.write(selftest.KIND, state.path_key(venv), forged | selftest._subject(Venv(venv)))
    assert hazard_statuses(venv)["H4"] == "ok"
    # ...but not for another venv put at this path (same torch RECORD, another directory)...
    moved = tmp_path / "moved"
    venv.rename(moved)
    plain_venv(venv)
    fake_torch(venv)
    assert hazard_statuses(venv)["H4"] == "warn"
    # ...nor once torch's files changed since the test ran.
    state.write(selftest.KIND, state.path_key(venv), forged | selftest._subject(Venv(venv)))
    assert hazard_statuses(venv)["H4"] == "ok"
    record_file = own_site_packages(venv) / "torch-2.13.0+cpu.dist-info" / "RECORD"
    record_file.write_text(record_file.read_text() + "torch/evil.py,,\n")
    assert hazard_statuses(venv)["H4"] == "warn"


def test_a_stat_index_others_can_write_is_ignored_with_a_warning(tmp_path, wheelhouse, test_lock):
    venv = tmp_path / "made"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    assert run_envkit("doctor", "--venv", str(venv)).returncode == 0  # writes the index
    [index] = (Path(os.environ["ENVKIT_CACHE_DIR"]) / "doctor").glob("*.json")
    edited = next(own_site_packages(venv).glob("ekt_alpha/*.py"))
    before, text = os.stat(edited), edited.read_text()
    edited.unlink()  # a new inode: uv hard-links from its shared cache, whose copy must stay as shipped
    edited.write_text(text + "# edited\n")
    # Someone with write access to the index records the edited file's new stat as verified.
    data = json.loads(index.read_text())
    relative = str(edited.relative_to(own_site_packages(venv)))
    after = os.stat(edited)
    data["files"][relative][:4] = [after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino]
    index.write_text(json.dumps(data))
    index.chmod(0o666)
    assert before.st_size != after.st_size
    proc, report = doctor_json(venv)
    assert "Warning: ignoring" in proc.stderr and "others can write" in proc.stderr
    assert [f["subject"] for f in failing(report, "files.modified")] == [relative]


@pytest.mark.parametrize("name", ["envkit.json", "INSTALLER"])
def test_a_fifo_where_doctor_reads_never_hangs_it(tmp_path, name):
    venv = plain_venv(tmp_path / "v")
    site = own_site_packages(venv)
    dist_info = site / "ekt_fake-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: ekt-fake\nVersion: 1.0\n")
    (dist_info / "RECORD").write_text("")
    os.mkfifo(venv / name if name == "envkit.json" else dist_info / name)
    proc = run_envkit("doctor", "--venv", str(venv), "--history", timeout=30)  # a hang fails by timeout
    assert "Traceback" not in proc.stderr
    if name == "envkit.json":
        assert proc.returncode == 1 and proc.stderr.startswith("Error: ") and "envkit.json" in proc.stderr


# -- hangs ---------------------------------------------------------------------------------------
def test_doctor_never_opens_a_fifo_or_a_device_and_stays_inside_site_packages(tmp_path):
    venv = plain_venv(tmp_path / "venv")
    sp = site_packages(venv)
    os.mkfifo(sp / "hang.py")
    (sp / "zz.pth").symlink_to("/dev/zero")
    outside = tmp_path / "outside.py"
    outside.write_text("secret")
    fake_dist_info(venv, "hang-1.0.dist-info", "Metadata-Version: 2.1\nName: hang\nVersion: 1.0\n",
                   record="hang.py,sha256=AAAA,1\nsub/../../../../outside.py,sha256=AAAA,6\n")
    proc = subprocess.run([sys.executable, "-m", "envkit", "doctor", "--venv", str(venv), "--json"],
                          capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    failing = {(f["id"], f["subject"]) for f in report["findings"] if f["status"] == "fail"}
    assert ("files.modified", "hang.py") in failing and ("site.pth", "zz.pth") in failing
    assert not any("outside.py" in f["subject"] for f in report["findings"])
    # Train's preflight runs the same checks: a FIFO in a venv can hang neither.
    sp.joinpath("hang-1.0.dist-info", "RECORD").write_text("x" * (200 << 10) + ",sha256=AAAA,1\n")
    proc = subprocess.run([sys.executable, "-m", "envkit", "doctor", "--venv", str(venv), "-v"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "hang-1.0.dist-info/RECORD is unreadable" in proc.stdout
