from __future__ import annotations

import subprocess
import sys

from conftest import run_envkit

from envkit import profile as profiles


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
