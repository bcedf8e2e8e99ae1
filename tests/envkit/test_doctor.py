"""`envkit doctor`: strays, drift, duplicates, edited files (with their diff), leaking env vars, --fix, the
stat index that never hides an edit, and escape sequences kept out of the terminal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from helpers import (booby_trapped_project, build_wheel, create_args, fake_dist_info, one_line_error, plain_venv,
                     run_envkit, site_packages, write_profile)


@pytest.fixture(scope="session")
def doctor_wheelhouse(wheelhouse) -> Path:
    build_wheel(wheelhouse, "ekt-delta", "1.0")
    build_wheel(wheelhouse, "ekt-epsilon", "1.0", requires=("ekt-delta==1.0",))
    build_wheel(wheelhouse, "ekt-zeta", "1.0")
    return wheelhouse


@pytest.fixture
def clean_venv(tmp_path, doctor_wheelhouse, monkeypatch) -> Path:
    # uv hard-links from its cache, so the hand patch below edits the cache copy too: keep it private.
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    lock = write_profile(tmp_path / "doc.toml", ["ekt-alpha==1.0", "ekt-gamma==1.0", "ekt-epsilon==1.0"])
    run_envkit("lock", "--lock", str(lock), "--no-index", "--find-links", str(doctor_wheelhouse), check=True)
    venv = tmp_path / "venv"
    run_envkit("create", "--lock", str(lock), "--venv", str(venv), "--no-index", "--find-links",
               str(doctor_wheelhouse), check=True)
    return venv


def uv_pip(venv: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "uv", "pip", *args, "--python", str(venv / "bin" / "python")],
                   check=True, capture_output=True)


def pollute(venv: Path, wheelhouse: Path, tmp_path: Path) -> dict[str, str]:
    """Pollute the venv the way training venvs get polluted; return the environment to run doctor in."""
    sp = site_packages(venv)
    uv_pip(venv, "install", "--no-index", "--find-links", str(wheelhouse), "sglang==0.0.1")  # stray
    uv_pip(venv, "install", "--no-index", "--find-links", str(wheelhouse), "ekt-beta==1.0")  # drift (the lock resolved 2.0)
    uv_pip(venv, "uninstall", "ekt-delta")  # a missing dependency of ekt-epsilon
    (sp / "ekt_alpha" / "__init__.py").write_text("VERSION = 'patched by hand'\n")  # hand patch
    second = sp / "ekt_gamma-0.9.dist-info"  # a half-finished swap left a second dist-info
    shutil.copytree(sp / "ekt_gamma-1.0.dist-info", second)
    (second / "METADATA").write_text("Metadata-Version: 2.1\nName: ekt-gamma\nVersion: 0.9\n")
    (sp / "zz_injected.pth").write_text("import os; os.environ.setdefault('INJECTED', '1')\n")
    open_cache = tmp_path / "open-cache"
    open_cache.mkdir()
    open_cache.chmod(0o777)
    return dict(os.environ, PYTHONPATH=str(tmp_path / "elsewhere"), TORCHINDUCTOR_CACHE_DIR=str(open_cache))


def doctor_json(venv: Path, *args: str, env=None) -> tuple[int, dict]:
    proc = run_envkit("doctor", "--venv", str(venv), "--json", *args, env=env)
    return proc.returncode, json.loads(proc.stdout)


def failing(report: dict) -> set[tuple[str, str]]:
    return {(f["id"], f["subject"]) for f in report["findings"] if f["status"] == "fail"}


def test_clean_venv_passes(clean_venv):
    code, report = doctor_json(clean_venv)
    assert code == 0, report
    assert report["summary"]["fail"] == 0 and report["profile"] == "ekt"
    assert {f["id"] for f in report["findings"]} >= {"lock.version", "stray.known", "files.modified", "env.leak"}


def test_every_injected_fault_is_named(clean_venv, doctor_wheelhouse, tmp_path):
    env = pollute(clean_venv, doctor_wheelhouse, tmp_path)
    code, report = doctor_json(clean_venv, env=env)
    assert code == 1
    expected = {
        ("stray.known", "sglang"),
        ("lock.version", "ekt-beta"),
        ("lock.missing", "ekt-delta"),
        ("dist.requires", "ekt-epsilon"),
        ("files.modified", "ekt_alpha/__init__.py"),
        ("dist.duplicate", "ekt-gamma"),
        ("site.pth", "zz_injected.pth"),
        ("env.leak", "PYTHONPATH"),
        ("cache.perms", env["TORCHINDUCTOR_CACHE_DIR"]),
    }
    assert expected <= failing(report), sorted(failing(report))
    for finding in report["findings"]:
        if finding["status"] == "fail":
            assert finding["message"] and finding["fix"], finding
    table = run_envkit("doctor", "--venv", str(clean_venv), env=env)
    assert table.returncode == 1 and "FAIL" in table.stdout and "sglang" in table.stdout
    assert "\x1b[" not in table.stdout  # no colour when not on a terminal


def test_fix_resyncs_everything_but_env_and_cache(clean_venv, doctor_wheelhouse, tmp_path):
    env = pollute(clean_venv, doctor_wheelhouse, tmp_path)
    proc = run_envkit("doctor", "--venv", str(clean_venv), "--fix", "--no-index", "--find-links",
                      str(doctor_wheelhouse), "--json", env=env)
    report = json.loads(proc.stdout)
    assert {finding_id for finding_id, _ in failing(report)} == {"env.leak", "cache.perms"}
    clean_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR")}
    code, report = doctor_json(clean_venv, env=clean_env)
    assert code == 0, failing(report)
    alpha = subprocess.run([str(clean_venv / "bin" / "python"), "-c", "import ekt_alpha; print(ekt_alpha.VERSION)"],
                           capture_output=True, text=True, env=clean_env).stdout.strip()
    assert alpha == "1.0"


def test_strict_fails_on_warnings(clean_venv):
    (site_packages(clean_venv) / "extra_paths.pth").write_text("/somewhere/else\n")
    assert run_envkit("doctor", "--venv", str(clean_venv)).returncode == 0
    assert run_envkit("doctor", "--venv", str(clean_venv), "--strict").returncode == 1


def test_without_a_lock_the_other_checks_run(tmp_path, doctor_wheelhouse):
    venv = tmp_path / "plain"
    subprocess.run([sys.executable, "-m", "uv", "venv", str(venv), "-q"], check=True)
    uv_pip(venv, "install", "--no-index", "--find-links", str(doctor_wheelhouse), "sglang==0.0.1")
    code, report = doctor_json(venv)
    assert code == 1 and report["profile"] is None
    assert ("stray.known", "sglang") in failing(report)
    assert any("--profile" in s for s in report["skipped"])


def test_not_a_venv_is_a_usage_error(tmp_path):
    proc = run_envkit("doctor", "--venv", str(tmp_path))
    assert proc.returncode == 1 and proc.stderr.startswith("Error: ") and "not a venv" in proc.stderr


@pytest.mark.e2e
def test_real_cpu_venv_reports_torch_hazards(cpu_venv):
    code, report = doctor_json(cpu_venv)
    hazards = {f["subject"] for f in report["findings"] if f["id"] == "torch.hazard"}
    assert {"H1", "H2", "H3"} <= hazards
    assert "H6" not in hazards  # fixed in torch 2.11
    build = [f for f in report["findings"] if f["id"] == "torch.build"]
    assert build and build[0]["status"] == "ok" and "CPU build" in build[0]["message"]
    assert code == 0, failing(report)


def created_an_hour_ago(venv: Path) -> None:
    """What follows happens after the create, as it would days later: the venv's record and dist-infos are dated
    an hour back (instead of sleeping past the create's slack)."""
    earlier = time.time() - 3600
    manifest = json.loads((venv / "envkit.json").read_text())
    manifest["created_at"] = datetime.fromtimestamp(earlier, timezone.utc).isoformat(timespec="seconds")
    (venv / "envkit.json").write_text(json.dumps(manifest))
    for dist_info in site_packages(venv).glob("*.dist-info"):
        os.utime(dist_info, (earlier, earlier))


def test_the_story_groups_every_finding_under_its_cause(clean_venv, doctor_wheelhouse, tmp_path):
    created_an_hour_ago(clean_venv)
    env = pollute(clean_venv, doctor_wheelhouse, tmp_path)
    # One more stray, by pip this time, so that installers differ.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(clean_venv / "bin" / "python"), "install", "-q",
                    "--no-index", "--find-links", str(doctor_wheelhouse), "ekt-zeta==1.0"], check=True,
                   capture_output=True)
    code, report = doctor_json(clean_venv, env=env)
    bad = [i for i, f in enumerate(report["findings"]) if f["status"] != "ok"]
    covered = sorted(i for cause in report["causes"] for i in cause["findings"])
    assert covered == bad  # every non-ok finding under exactly one cause
    summaries = " | ".join(c["summary"] for c in report["causes"])
    for needle in ("sglang 0.0.1 installed", "ekt-beta 2.0 replaced by 1.0", "ekt-delta 1.0 removed",
                   "ekt_alpha/__init__.py edited by hand", "second dist-info of ekt-gamma", "zz_injected.pth",
                   "PYTHONPATH", "compile cache"):
        assert needle in summaries, (needle, summaries)
    [stray] = [c for c in report["causes"] if c["id"] == "package:sglang"]
    assert stray["installer"] == "uv" and stray["when"]
    [by_pip] = [c for c in report["causes"] if c["id"] == "package:ekt-zeta"]
    assert by_pip["installer"] == "pip" and "ekt-zeta 1.0 installed" in by_pip["summary"]
    history = [e for e in report["history"] if e["action"] in ("installed", "replaced")]
    assert [e["subject"] for e in history] == ["sglang", "ekt-beta", "ekt-zeta"]  # in the order they happened
    text = run_envkit("doctor", "--venv", str(clean_venv), env=env).stdout
    assert len(text.splitlines()) <= 40 and "what happened" in text and text.count("envkit doctor --fix") == 1
    unfolded = run_envkit("doctor", "--venv", str(clean_venv), "-v", env=env).stdout
    assert len(unfolded.splitlines()) > len(text.splitlines())
    timeline = run_envkit("doctor", "--venv", str(clean_venv), "--history", env=env).stdout
    assert timeline.index("sglang") < timeline.index("ekt-beta") and "removed" in timeline


def test_a_hand_edit_shows_as_a_diff_against_the_shipped_wheel(clean_venv, doctor_wheelhouse, tmp_path):
    init = site_packages(clean_venv) / "ekt_alpha" / "__init__.py"
    init.unlink()  # a new inode: uv's cached copy stays as shipped (an in-place edit would change both)
    init.write_text("VERSION = '1.0'\nHOTFIX = True  # appended by hand\n")
    _, report = doctor_json(clean_venv)  # uv's cache still holds the file as shipped (a new inode above)
    [edit] = [f for f in report["findings"] if f["id"] == "files.modified"]
    assert "+HOTFIX = True  # appended by hand" in edit["detail"]
    shutil.rmtree(tmp_path / "uv-cache")  # no copy as shipped left on this machine: doctor says how to get one
    _, report = doctor_json(clean_venv, env=dict(os.environ, PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull))
    [edit] = [f for f in report["findings"] if f["id"] == "files.modified"]
    assert "envkit doctor --fetch" in edit["detail"] and "+HOTFIX" not in edit["detail"]
    _, report = doctor_json(clean_venv, "--find-links", str(doctor_wheelhouse))  # the wheel is on this machine
    [edit] = [f for f in report["findings"] if f["id"] == "files.modified"]
    assert "+HOTFIX = True  # appended by hand" in edit["detail"] and "(as shipped)" in edit["detail"]
    text = run_envkit("doctor", "--venv", str(clean_venv), "--find-links", str(doctor_wheelhouse)).stdout
    assert "+HOTFIX = True" in text


@pytest.mark.e2e
def test_fetch_downloads_exactly_that_version_to_show_the_edit(tmp_path, monkeypatch):
    """A real package from the index: the appended hotfix appears in the diff only with --fetch."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    lock = write_profile(tmp_path / "six.toml", ["six==1.17.0"], name="six")
    run_envkit("lock", "--lock", str(lock), check=True)
    venv = tmp_path / "venv"
    run_envkit("create", "--lock", str(lock), "--venv", str(venv), check=True)
    six = site_packages(venv) / "six.py"
    with six.open("a") as handle:  # in place: uv's cached copy is edited too, so only the index has the original
        handle.write("HOTFIX = 'appended by hand'\n")
    shutil.rmtree(tmp_path / "uv-cache")
    _, report = doctor_json(venv)
    [edit] = [f for f in report["findings"] if f["id"] == "files.modified"]
    assert "--fetch" in edit["detail"] and "HOTFIX" not in edit["detail"]
    _, report = doctor_json(venv, "--fetch")
    [edit] = [f for f in report["findings"] if f["id"] == "files.modified"]
    assert "+HOTFIX = 'appended by hand'" in edit["detail"]


def _record_digests(venv: Path) -> set[tuple[str, str]]:
    import hashlib

    return {(info.name, hashlib.sha256((info / "RECORD").read_bytes()).hexdigest())
            for info in site_packages(venv).glob("*.dist-info")}


def test_adopting_a_polluted_venv_leaves_the_strays_out_and_says_so(clean_venv, doctor_wheelhouse, tmp_path):
    uv_pip(clean_venv, "install", "--no-index", "--find-links", str(doctor_wheelhouse), "sglang==0.0.1")
    adopted = tmp_path / "adopted.toml"
    proc = run_envkit("lock", "--from-venv", str(clean_venv), "--lock", str(adopted), "--no-index", "--find-links",
                      str(doctor_wheelhouse))
    assert proc.returncode == 0, proc.stderr
    assert "left out sglang" in proc.stdout
    text = adopted.read_text()
    assert '"ekt-alpha==1.0"' in text and "sglang" not in text and "sha256:" in text
    again = run_envkit("lock", "--from-venv", str(clean_venv), "--lock", str(adopted))
    assert again.returncode == 1 and "exists" in again.stderr  # never overwrites a lock
    kept = tmp_path / "kept.toml"
    run_envkit("lock", "--from-venv", str(clean_venv), "--lock", str(kept), "--keep-strays", "--no-index",
               "--find-links", str(doctor_wheelhouse), check=True)
    assert '"sglang==0.0.1"' in kept.read_text()
    rebuilt = tmp_path / "rebuilt"
    run_envkit("create", "--lock", str(adopted), "--venv", str(rebuilt), "--no-index", "--find-links",
               str(doctor_wheelhouse), check=True)
    assert _record_digests(rebuilt) == _record_digests(clean_venv) - {
        d for d in _record_digests(clean_venv) if d[0].startswith("sglang")}


@pytest.mark.e2e
def test_adopting_the_cpu_venv_reproduces_it(cpu_venv, tmp_path):
    adopted = tmp_path / "mine.toml"
    proc = run_envkit("lock", "--from-venv", str(cpu_venv), "--lock", str(adopted), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert 'torch-backend = "cpu"' in adopted.read_text()
    rebuilt = tmp_path / "rebuilt"
    run_envkit("create", "--lock", str(adopted), "--venv", str(rebuilt), check=True, timeout=900)
    assert _record_digests(rebuilt) == _record_digests(cpu_venv)


def venv_and_doctor(tmp_path, test_lock, wheelhouse, monkeypatch):
    """A venv of the test lock (its own uv cache, so edits stay in it), and doctor's files.modified subjects."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)

    def modified() -> list[str]:
        report = json.loads(run_envkit("doctor", "--venv", str(venv), "--json").stdout)
        return [f["subject"] for f in report["findings"] if f["id"] == "files.modified" and f["status"] == "fail"]

    return venv, modified


ESC = "\x1b"


def test_ld_library_path_outside_the_venv_with_cuda_libraries_is_a_leak(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, wheelhouse), check=True)
    cuda = tmp_path / "cuda-12" / "lib64"
    cuda.mkdir(parents=True)
    (cuda / "libcudart.so.12").write_bytes(b"")
    plain = tmp_path / "plain-libs"
    plain.mkdir()
    (plain / "libfoo.so").write_bytes(b"")

    def leaks(value: str) -> list[dict]:
        proc = run_envkit("doctor", "--venv", str(venv), "--json", env=dict(os.environ, LD_LIBRARY_PATH=value))
        return [f for f in json.loads(proc.stdout)["findings"] if f["id"] == "env.leak" and f["status"] != "ok"]

    [leak] = leaks(f"{plain}:{cuda}")
    assert leak["status"] == "fail" and leak["subject"] == "LD_LIBRARY_PATH" and str(cuda) in leak["message"]
    assert leaks(str(plain)) == []


def test_the_stat_index_never_hides_an_edit_with_its_mtime_restored(tmp_path, test_lock, wheelhouse, monkeypatch):
    """doctor hashes again only files whose stat changed; an edit of the same size with the old mtime put back
    still changes ctime, so it is still caught (and the index records only verified files)."""
    venv, modified = venv_and_doctor(tmp_path, test_lock, wheelhouse, monkeypatch)
    assert modified() == []  # the first run hashes everything and writes the index
    index = next((tmp_path / "envkit-cache" / "doctor").glob("*.json"))
    assert oct(index.stat().st_mode & 0o777) == "0o600"
    module = next((venv / "lib").glob("python3*/site-packages")) / "ekt_alpha" / "__init__.py"
    before = module.stat()
    text = module.read_text()
    time.sleep(0.01)
    module.write_text(text[:-2] + "#\n")  # the same size
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert module.stat().st_size == before.st_size and module.stat().st_mtime_ns == before.st_mtime_ns
    assert modified() == ["ekt_alpha/__init__.py"]
    deep = json.loads(run_envkit("doctor", "--venv", str(venv), "--json", "--deep").stdout)
    assert any(f["subject"] == "ekt_alpha/__init__.py" and f["status"] == "fail" for f in deep["findings"])


def test_an_edited_record_is_read_again_even_with_its_mtime_restored(tmp_path, test_lock, wheelhouse, monkeypatch):
    """doctor skips parsing a RECORD whose stat is unchanged since it was indexed; a RECORD edited in place (a
    file's digest changed, the size and mtime put back) is parsed again and its file no longer matches."""
    venv, modified = venv_and_doctor(tmp_path, test_lock, wheelhouse, monkeypatch)
    assert modified() == [] and modified() == []  # the second run reads the RECORDs from the index
    record = next(next((venv / "lib").glob("python3*/site-packages")).glob("ekt_alpha-*.dist-info")) / "RECORD"
    before = record.stat()
    text = record.read_text()
    row = next(line for line in text.splitlines() if line.startswith("ekt_alpha/__init__.py,sha256="))
    digest = row.split("sha256=")[1].split(",")[0]
    forged = ("A" if digest[0] != "A" else "B") + digest[1:]  # the same length: the RECORD keeps its size
    record.write_text(text.replace(digest, forged))
    os.utime(record, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert record.stat().st_size == before.st_size and record.stat().st_mtime_ns == before.st_mtime_ns
    assert modified() == ["ekt_alpha/__init__.py"]


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


def test_doctor_fetch_never_builds_a_direct_reference(tmp_path):
    project, marker = booby_trapped_project(tmp_path)
    venv = plain_venv(tmp_path / "venv")
    module = site_packages(venv) / "evil.py"
    module.write_text("edited\n")
    fake_dist_info(venv, "evil-1.0.dist-info", f"Metadata-Version: 2.1\nName: evil @ file://{project}\nVersion: 1.0\n",
                   record="evil.py,sha256=AAAA,7\n")
    proc = run_envkit("doctor", "--venv", str(venv), "--fetch", "--json")
    assert proc.returncode == 1 and not marker.exists()
    report = json.loads(proc.stdout)
    assert any(f["id"] == "dist.invalid" and f["status"] == "fail" for f in report["findings"])


# -- what reaches a terminal or a shell line -------------------------------------------------------
def test_escape_sequences_from_a_venv_never_reach_the_terminal_raw(tmp_path, wheelhouse, monkeypatch):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    lock = write_profile(tmp_path / "e.toml", ["ekt-alpha==1.0"])
    run_envkit("lock", "--lock", str(lock), "--no-index", "--find-links", str(wheelhouse), check=True)
    venv = tmp_path / "v;touch PWNED"
    run_envkit("create", "--lock", str(lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    sp = site_packages(venv)
    (sp / "ekt_alpha" / "__init__.py").write_text(f"VERSION = '1.0'\nevil = 1  # {ESC}[1A{ESC}[2K\n")
    (next(sp.glob("ekt_alpha-*.dist-info")) / "INSTALLER").write_text(f"uv{ESC}]0;owned{ESC}\\\n")
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--no-index", "--find-links", str(wheelhouse),
                    "sglang==0.0.1", "--python", str(venv / "bin" / "python")], check=True, capture_output=True)
    for extra in ((), ("-v",), ("--history",)):
        proc = run_envkit("doctor", "--venv", str(venv), "--find-links", str(wheelhouse), *extra)
        assert proc.returncode in (0, 1) and ESC not in proc.stdout + proc.stderr
    # The diff of the edit shows the added line, its escapes written out instead of obeyed.
    shown = run_envkit("doctor", "--venv", str(venv), "--find-links", str(wheelhouse)).stdout
    assert "+evil = 1  # \\x1b[1A\\x1b[2K" in shown
    report = json.loads(run_envkit("doctor", "--venv", str(venv), "--json").stdout)
    fixes = [f["fix"] for f in report["findings"] if f["fix"]]
    assert fixes and all("'" + str(venv) in fix for fix in fixes if str(venv) in fix)


def test_error_lines_never_carry_raw_escape_bytes(tmp_path):
    lock = tmp_path / f"evil{ESC}[2J.toml"
    lock.write_text("[profile\n")
    proc = run_envkit("create", "--lock", str(lock), "--venv", str(tmp_path / "v"))
    assert ESC not in proc.stderr and "\\x1b" in one_line_error(proc)
