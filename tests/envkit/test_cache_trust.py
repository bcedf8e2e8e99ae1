"""The compile cache under attack: crafted imports, links, special files, loose permissions, kills."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from helpers import copy_root, one_line_error, plain_venv, run_envkit

pytestmark = pytest.mark.e2e


def cache_env(root: Path, **extra) -> dict:
    return dict(os.environ, ENVKIT_CACHE_DIR=str(root), **extra)


def env_key_dir(root: Path) -> Path:
    [found] = [p for p in (root / "compile").iterdir() if p.is_dir() and not p.name.startswith(".")]
    return found


def verify(venv: Path, root: Path) -> subprocess.CompletedProcess:
    return run_envkit("warm-cache", "--venv", str(venv), "--verify", env=cache_env(root), timeout=60)


def doctor_findings(venv: Path, root: Path, *ids: str) -> list[dict]:
    proc = run_envkit("doctor", "--venv", str(venv), "--json", env=cache_env(root), timeout=60)
    return [f for f in json.loads(proc.stdout)["findings"] if f["id"] in ids and f["status"] != "ok"]


@pytest.fixture(scope="module")
def legit_export(tmp_path_factory, cpu_venv, warm_cache_root) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("export")
    root = copy_root(warm_cache_root, tmp / "root")
    bundle = tmp / "tiny.envkit-cache"
    result = json.loads(run_envkit("cache", "export", str(bundle), "--venv", str(cpu_venv), "--json",
                                   env=cache_env(root), check=True).stdout)
    assert result["sha256"] == hashlib.sha256(bundle.read_bytes()).hexdigest()
    return bundle, result["sha256"]


def test_a_pinned_export_imports_and_hits(cpu_venv, legit_export, tmp_path):
    bundle, digest = legit_export
    empty = tmp_path / "empty"
    proc = run_envkit("cache", "import", str(bundle), "--venv", str(cpu_venv), "--sha256", digest, "--json",
                      env=cache_env(empty))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["files"] > 0
    warm = json.loads(run_envkit("warm-cache", "--venv", str(cpu_venv), "--json", env=cache_env(empty),
                                 check=True).stdout)
    assert warm["counters"]["fxgraph_cache_miss"] == 0 and warm["counters"]["fxgraph_cache_hit"] > 0
    assert verify(cpu_venv, empty).returncode == 0
    assert not [p for p in (empty / "compile").iterdir() if ".import-" in p.name]  # no staging left


class Payload:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def craft(legit: Path, out: Path, *, kind: str = "inductor", key: str = "fevilevilevilevil", content: bytes,
          consistent: bool = True) -> str:
    """The legit export with one extra artifact; header digests updated when `consistent`. -> file sha256."""
    from torch.utils._appending_byte_serializer import BytesWriter

    with zipfile.ZipFile(legit) as archive:
        header = json.loads(archive.read("envkit-cache.json"))
        blob = archive.read("mega-cache.bin")
    writer = BytesWriter()
    writer._data.extend(blob[4:])  # the legit entries, after torch's checksum
    writer.write_str(kind)
    writer.write_uint64(1)
    writer.write_str(key)
    writer.write_bytes(content)
    crafted = writer.to_bytes()
    if consistent:
        header["blob_sha256"] = hashlib.sha256(crafted).hexdigest()
        header["artifacts"].append({"kind": kind, "key": key, "sha256": hashlib.sha256(content).hexdigest(),
                                    "size": len(content)})
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("envkit-cache.json", json.dumps(header))
        archive.writestr("mega-cache.bin", crafted)
    return hashlib.sha256(out.read_bytes()).hexdigest()


def test_crafted_exports_are_refused_before_torch_reads_them(cpu_venv, legit_export, tmp_path):
    bundle, legit_digest = legit_export
    marker = tmp_path / "PAYLOAD-RAN"
    payload = pickle.dumps(Payload(marker))
    root = tmp_path / "root"

    def import_(path: Path, *pin: str) -> subprocess.CompletedProcess:
        return run_envkit("cache", "import", str(path), "--venv", str(cpu_venv), *pin, env=cache_env(root), timeout=120)

    evil = tmp_path / "evil.envkit-cache"
    evil_digest = craft(bundle, evil, content=payload)
    cases = [
        (import_(evil), "pin the file you trust"),  # no pin at all
        (import_(evil, "--sha256", legit_digest), "not the pinned"),  # the file was swapped
    ]
    outside = craft(bundle, tmp_path / "outside.envkit-cache", key="../../../escaped", content=payload)
    cases.append((import_(tmp_path / "outside.envkit-cache", "--sha256", outside), "not a plain relative name"))
    absolute = craft(bundle, tmp_path / "absolute.envkit-cache", kind="autotune", key=str(tmp_path / "abs"),
                     content=b"{}")
    cases.append((import_(tmp_path / "absolute.envkit-cache", "--sha256", absolute), "not a plain relative name"))
    kind = craft(bundle, tmp_path / "kind.envkit-cache", kind="precompile", content=payload)
    cases.append((import_(tmp_path / "kind.envkit-cache", "--sha256", kind), "'precompile' is not accepted"))
    stale = craft(bundle, tmp_path / "stale.envkit-cache", content=payload, consistent=False)
    cases.append((import_(tmp_path / "stale.envkit-cache", "--sha256", stale), "does not match its header"))
    for proc, needle in cases:
        assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists()
    assert not list(tmp_path.rglob("escaped")) and not (tmp_path / "abs").exists()
    written = [p for p in (root / "compile").rglob("*") if p.is_file()] if (root / "compile").exists() else []
    assert written == []  # nothing fingerprinted, nothing written
    assert evil_digest != legit_digest


def test_import_refuses_another_env_key(cpu_venv, legit_export, tmp_path):
    bundle, _ = legit_export
    with zipfile.ZipFile(bundle) as archive:
        header = json.loads(archive.read("envkit-cache.json"))
        blob = archive.read("mega-cache.bin")
    header["env_key"], header["key_parts"]["torch"] = "0" * 16, "2.11.0+cu130"
    foreign = tmp_path / "foreign.envkit-cache"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("envkit-cache.json", json.dumps(header))
        archive.writestr("mega-cache.bin", blob)
    digest = hashlib.sha256(foreign.read_bytes()).hexdigest()
    proc = run_envkit("cache", "import", str(foreign), "--venv", str(cpu_venv), "--sha256", digest)
    assert proc.returncode == 1 and "torch: exported '2.11.0+cu130', here '2.13.0+cpu'" in proc.stderr


def test_malformed_exports_are_errors(cpu_venv, tmp_path):
    cases = {"notzip": b"hello", "list-header": None}
    (tmp_path / "notzip").write_bytes(cases["notzip"])
    with zipfile.ZipFile(tmp_path / "list-header", "w") as archive:
        archive.writestr("envkit-cache.json", "[1, 2]")
        archive.writestr("mega-cache.bin", b"")
    for name in cases:
        path = tmp_path / name
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        proc = run_envkit("cache", "import", str(path), "--venv", str(cpu_venv), "--sha256", digest)
        assert proc.returncode == 1 and proc.stderr.startswith("Error:") and "Traceback" not in proc.stderr


def test_export_into_a_missing_dir_fails_before_warming(cpu_venv, tmp_path):
    proc = run_envkit("cache", "export", str(tmp_path / "missing" / "x"), "--venv", str(cpu_venv),
                      env=cache_env(tmp_path / "cold-root"))
    assert proc.returncode == 1 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "cold-root" / "compile").exists()  # refused before any warming


def test_links_and_special_files_are_never_trusted(cpu_venv, warm_cache_root, tmp_path):
    root = copy_root(warm_cache_root, tmp_path / "root")
    cache_dir = env_key_dir(root)
    (tmp_path / "elsewhere.py").write_text("print('code from elsewhere')\n")
    (cache_dir / "inductor" / "planted.py").symlink_to(tmp_path / "elsewhere.py")
    proc = verify(cpu_venv, root)
    assert proc.returncode == 1 and "symlink" in proc.stdout + proc.stderr
    [finding] = doctor_findings(cpu_venv, root, "cache.fingerprint")
    assert finding["status"] == "fail" and "unverifiable" in finding["message"]
    proc = run_envkit("warm-cache", "--venv", str(cpu_venv), env=cache_env(root))
    assert proc.returncode == 1 and "symlink" in proc.stderr  # never re-fingerprinted to launder the link

    root = copy_root(warm_cache_root, tmp_path / "root2")
    cache_dir = env_key_dir(root)
    moved = tmp_path / "moved-key-dir"
    cache_dir.rename(moved)
    cache_dir.symlink_to(moved)
    proc = run_envkit("warm-cache", "--venv", str(cpu_venv), env=cache_env(root))
    assert proc.returncode == 1 and "symlink" in proc.stderr

    root = copy_root(warm_cache_root, tmp_path / "root3")
    fingerprint = env_key_dir(root) / "fingerprint.json"
    fingerprint.unlink()
    os.mkfifo(fingerprint)
    for args in (["warm-cache", "--venv", str(cpu_venv), "--verify"], ["cache", "ls"],
                 ["doctor", "--venv", str(cpu_venv)]):
        proc = run_envkit(*args, env=cache_env(root), timeout=60)  # returns: a FIFO never blocks envkit
        assert "Traceback" not in proc.stderr
    assert verify(cpu_venv, root).returncode == 1


def test_every_directory_of_the_cache_is_checked(cpu_venv, warm_cache_root, tmp_path):
    for target in ("key", "inductor"):
        root = copy_root(warm_cache_root, tmp_path / f"root-{target}")
        cache_dir = env_key_dir(root)
        (cache_dir if target == "key" else cache_dir / "inductor").chmod(0o777)
        perms = doctor_findings(cpu_venv, root, "cache.perms")
        assert perms and perms[0]["status"] == "fail" and "777" in perms[0]["message"]
        assert verify(cpu_venv, root).returncode == 1
        proc = run_envkit("train", "--venv", str(cpu_venv), "--no-warm", "--name", "x", "--", "--steps", "1",
                          env=cache_env(root, ENVKIT_RUNS_DIR=str(tmp_path / "runs")))
        assert proc.returncode == 1 and "nothing was started" in proc.stderr
    if os.geteuid() == 0:
        root = copy_root(warm_cache_root, tmp_path / "root-owner")
        os.chown(env_key_dir(root) / "triton", 12345, -1)
        perms = doctor_findings(cpu_venv, root, "cache.perms")
        assert perms and "uid 12345" in perms[0]["message"]


def test_unrelated_broken_cache_does_not_fail_this_venv_and_strict_means_something(cpu_venv, warm_cache_root,
                                                                                  tmp_path):
    root = copy_root(warm_cache_root, tmp_path / "root")
    other = root / "compile" / ("f" * 16)
    other.mkdir(mode=0o700)
    (other / "fingerprint.json").write_text("{ truncated")
    assert doctor_findings(cpu_venv, root, "cache.fingerprint") == []
    proc = run_envkit("doctor", "--venv", str(cpu_venv), "--strict", "--json", env=cache_env(root))
    report = json.loads(proc.stdout)
    hazards = [f for f in report["findings"] if f["id"] == "torch.hazard" and f["subject"] in ("H1", "H2", "H3")]
    assert hazards and all(f["status"] == "ok" and "mitigated" in f["message"] for f in hazards)
    assert proc.returncode == 0, [f for f in report["findings"] if f["status"] != "ok"]


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name (state first, then the parent's pid)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _warmups_of(parent: int) -> list[int]:
    """The `python -m trainer warmup` processes whose parent is `parent`: the other xdist worker may be warming a
    cache of its own at the same moment, and its warm-up must not be taken for this one's."""
    pids = []
    for proc_dir in Path("/proc").iterdir():
        try:
            if (proc_dir.name.isdigit() and b"trainer\0warmup" in (proc_dir / "cmdline").read_bytes()
                    and int(_stat(proc_dir.name)[1]) == parent):
                pids.append(int(proc_dir.name))
        except OSError:
            continue
    return pids


def _alive(pid: int) -> bool:
    """Running, not a zombie (a dead child of init is reaped at once; of a subreaper, maybe not)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def test_a_killed_warm_cache_takes_its_warmup_child_with_it(cpu_venv, tmp_path):
    root = tmp_path / "cold"
    proc = subprocess.Popen([sys.executable, "-m", "envkit", "warm-cache", "--venv", str(cpu_venv)],
                            env=cache_env(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    children = []
    while time.monotonic() < deadline and not children:
        children = _warmups_of(proc.pid)
        time.sleep(0.2)
    assert children, "the warm-up child never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(map(_alive, children)):
        time.sleep(0.2)
    assert not any(map(_alive, children))


# -- reads that must not block ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_cache_import_never_hashes_a_fifo_or_a_device(tmp_path, kind):
    source = tmp_path / "cache.zip"
    if kind == "fifo":
        os.mkfifo(source)
    else:
        source.symlink_to("/dev/zero")
    proc = run_envkit("cache", "import", str(source), "--sha256", "0" * 64, "--venv", str(plain_venv(tmp_path / "v")),
                      timeout=30)
    assert "cannot be imported" in one_line_error(proc)


# -- output that must not become syntax -------------------------------------------------------------------
def test_fix_lines_quote_cache_paths(tmp_path, wheelhouse, test_lock):
    venv = tmp_path / "v"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    evil = tmp_path / "x; touch PWNED"
    (evil / "inductor").mkdir(parents=True)
    (evil / "inductor").chmod(0o777)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(evil / "inductor"))
    report = json.loads(run_envkit("doctor", "--venv", str(venv), "--json", env=env).stdout)
    fixes = [f["fix"] for f in report["findings"] if f["id"] == "cache.perms" and f["status"] == "fail"]
    assert fixes
    for fix in fixes:
        for command in fix.split(", or "):
            words = shlex.split(command.replace(" (and remove links)", ""))
            assert any(str(evil) in word for word in words), fix  # the path stays one word
