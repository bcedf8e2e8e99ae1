"""Claims the README makes that had no test: each one here could fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PROJECT, run_envkit, run_json, write_profile
from wheels import build_wheel


def create_args(lock: Path, venv: Path, *extra: str) -> list[str]:
    return ["create", "--lock", str(lock), "--venv", str(venv), "--no-index", *extra]


def test_pip_conf_find_links_is_a_wheelhouse(tmp_path, wheelhouse, monkeypatch):
    """A cluster that configures pip, not uv: create finds the wheelhouse through pip's own config file."""
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {wheelhouse}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    lock = write_profile(tmp_path / "p.toml", ["ekt-gamma==1.0"])
    run_envkit("lock", "--lock", str(lock), "--no-index", check=True)  # no --find-links anywhere
    result = run_json(*create_args(lock, tmp_path / "venv"), check=True)
    assert result["action"] == "created" and result["packages"] == 1
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "empty.conf"))
    proc = run_envkit(*create_args(lock, tmp_path / "venv2"))
    assert proc.returncode == 1 and "ekt-gamma" in proc.stderr  # without the config, no source has it


def test_a_wheelhouse_torch_is_the_source_of_torch(tmp_path, monkeypatch):
    """With torch in a wheelhouse, the profile's torch-backend is not passed to uv (which would ignore the
    wheelhouse for torch) and the wheelhouse's torch is what gets installed."""
    from envkit.lock import source_args
    from envkit.profile import load_file

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
    run_envkit(*create_args(lock, venv, "--find-links", str(house)), check=True)
    assert (next((venv / "lib").glob("python3*/site-packages")) / "torch" / "__init__.py").read_text() == \
        "VERSION = '2.13.0'\n"


def test_ld_library_path_outside_the_venv_with_cuda_libraries_is_a_leak(tmp_path, test_lock, wheelhouse):
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, "--find-links", str(wheelhouse)), check=True)
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


def test_cache_prune_removes_only_caches_no_venv_uses(tmp_path, monkeypatch):
    from envkit.cache.fingerprint import files_digest

    root = tmp_path / "cache-root"
    monkeypatch.setenv("ENVKIT_CACHE_DIR", str(root))
    live_venv = tmp_path / "live"
    subprocess.run([sys.executable, "-m", "uv", "venv", str(live_venv), "-q"], check=True)
    python = next(line.split("=", 1)[1].strip() for line in (live_venv / "pyvenv.cfg").read_text().splitlines()
                  if line.startswith(("version_info", "version ")))

    def cache(key: str, venv: Path, torch: str | None) -> Path:
        path = root / "compile" / key
        (path / "inductor").mkdir(parents=True, mode=0o700)
        (path / "fingerprint.json").write_text(json.dumps({
            "key_parts": {"torch": torch, "python": python}, "venv": str(venv), "files": [],
            "digest": files_digest({})}))
        return path

    gone = cache("a" * 16, tmp_path / "deleted-venv", None)
    kept = cache("b" * 16, live_venv, None)  # no torch then, no torch now: still this venv's cache
    preview = run_json("cache", "prune", "--dry-run")
    assert [Path(row["path"]).name for row in preview] == [gone.name] and "is gone" in preview[0]["reason"]
    assert gone.exists()
    run_envkit("cache", "prune", check=True)
    assert not gone.exists() and kept.exists()


def test_export_dtype_writes_weights_in_that_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from trainer.config import tiny
    from trainer.loop import Trainer

    cfg = tiny()
    cfg.data.num_sequences, cfg.data.eval_sequences, cfg.data.buckets = 8, 2, [64]
    cfg.steps, cfg.compile = 1, False
    ckpt = Trainer.sequential(cfg, tmp_path / "run", log=lambda m: None).save_checkpoint()
    for dtype, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        out = tmp_path / dtype
        proc = subprocess.run([sys.executable, "-m", "trainer", "export", "--ckpt", str(ckpt), "--out", str(out),
                               "--dtype", dtype], cwd=PROJECT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch_dtype}
        assert json.loads((out / "config.json").read_text())["dtype"] == dtype


# -- flags honoured in every layout ----------------------------------------------------------------
def trainer(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=PROJECT,
                          timeout=600, **kwargs)


@pytest.mark.parametrize("args, needle", [
    (("train", "--no-mitigations"), "this run has no threads"),
    (("train", "--fail-at", "drafter:0:1"), "--fail-at injects"),
    (("train", "--device", "cpu", "--targets", "cpu"), "not both"),
    (("warmup", "--strict-compile"), "only apply to `train`"),
    (("warmup", "--no-compile"), "nothing to warm"),
    (("train", "--ou", "x"), "unrecognized arguments: --ou"),  # no abbreviation slips past envkit's reserved --out
])
def test_a_flag_a_layout_cannot_honour_is_refused(tmp_path, args, needle):
    proc = trainer(*args, "--out", str(tmp_path / "o"), "--steps", "1")
    assert proc.returncode in (1, 2) and needle in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_strict_compile_in_the_sequential_layout_stops_at_a_recompile(tmp_path, monkeypatch):
    """The sequential layout honours --strict-compile: a shape compiled after warm-up stops the run."""
    pytest.importorskip("torch")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from trainer.config import tiny
    from trainer.loop import Trainer

    def trainer_skipping_warmup(strict: bool) -> Trainer:
        cfg = tiny()
        cfg.data.buckets, cfg.data.num_sequences, cfg.data.eval_sequences = [64], 16, 2
        cfg.steps, cfg.log_every, cfg.eval_every, cfg.ckpt_every, cfg.walk_prompts, cfg.walk_new_tokens = \
            2, 1, 0, 0, 1, 8
        cfg.compile = True
        run = Trainer.sequential(cfg, tmp_path / f"run-{strict}", log=lambda m: None, strict_compile=strict)
        run.executor.warmup = lambda buckets, progress=None: []  # a bucket nobody warmed: the first step compiles
        return run

    strict = trainer_skipping_warmup(True)
    with pytest.raises(RuntimeError, match="--strict-compile: 1 recompiles"):
        strict.train()
    strict.close()
    import torch

    torch._dynamo.reset()  # the strict run's graph stays in dynamo's memory otherwise, and nothing recompiles
    lenient = trainer_skipping_warmup(False)
    summary = lenient.train()
    lenient.close()
    assert summary["recompiles"] >= 1


# -- signals ------------------------------------------------------------------------------------
SMALL = {"preset": "tiny", "compile": False, "eval_every": 0, "ckpt_every": 2, "log_every": 1, "walk_prompts": 1,
         "walk_new_tokens": 8, "data": {"buckets": [64], "num_sequences": 32, "eval_sequences": 2}}


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_a_second_signal_exits_at_once_and_writes_no_checkpoint(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps(SMALL))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config), "--out", str(out),
                             "--steps", "100000"], cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ((out / "checkpoint.pt").exists() and len(metrics(out)) >= 5):
        time.sleep(0.02)
    before = (out / "checkpoint.pt").read_bytes()
    # Two signals at once (two SIGINTs would merge into one pending signal): the first asks for a stop at the
    # next step boundary, the second is handled before the loop gets there.
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    assert "no checkpoint written" in stdout and "Traceback" not in stderr
    assert (out / "checkpoint.pt").read_bytes() == before  # the checkpoint of an earlier boundary, untouched

    from trainer import checkpoint

    state = checkpoint.load(out / "checkpoint.pt")
    saved_step = state["step"]
    assert saved_step % 2 == 0 and saved_step >= 2  # written at a ckpt_every boundary, never mid-step
    # The checkpoint is a consistent step: resuming from it gives exactly the losses the run had after it.
    seen = {row["step"]: row["loss"] for row in metrics(out)}
    resumed = subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(config), "--out", str(out),
                              "--steps", str(saved_step + 2), "--resume"], cwd=PROJECT, capture_output=True,
                             text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    redone = [row for row in metrics(out) if row["step"] > saved_step][-2:]
    assert [row["step"] for row in redone] == [saved_step + 1, saved_step + 2]
    for row in redone:
        if row["step"] in seen:
            assert row["loss"] == pytest.approx(seen[row["step"]], abs=1e-5)


def venv_and_doctor(tmp_path, test_lock, wheelhouse, monkeypatch):
    """A venv of the test lock (its own uv cache, so edits stay in it), and doctor's files.modified subjects."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    venv = tmp_path / "env"
    run_envkit(*create_args(test_lock, venv, "--find-links", str(wheelhouse)), check=True)

    def modified() -> list[str]:
        report = json.loads(run_envkit("doctor", "--venv", str(venv), "--json").stdout)
        return [f["subject"] for f in report["findings"] if f["id"] == "files.modified" and f["status"] == "fail"]

    return venv, modified


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
