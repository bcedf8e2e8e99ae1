"""Trust round 3: what a venv, a run dir, a run.json, a checkpoint or an old export says is data.

Each attack uses a real payload whose effect would show as a marker file (code ran), a missing file
(something was deleted), a timeout (a hang) or raw escape bytes (the terminal obeyed them).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PROJECT, run_envkit, write_profile

ESC = "\x1b"


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert lines, proc.stderr[-2000:]
    return lines[0]


def plain_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "uv", "venv", str(path), "-q"], check=True)
    return path


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def booby_trapped_project(tmp_path: Path) -> tuple[Path, Path]:
    """A local project whose build writes a marker: if any tool builds it, code from the venv ran."""
    project, marker = tmp_path / "evil", tmp_path / "CODE-RAN"
    project.mkdir()
    (project / "setup.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                      "from setuptools import setup\nsetup(name='evil', version='1.0')\n")
    return project, marker


def fake_dist_info(venv: Path, folder: str, metadata: str | None, record: str = "") -> Path:
    dist_info = site_packages(venv) / folder
    dist_info.mkdir()
    if metadata is not None:
        (dist_info / "METADATA").write_text(metadata)
    (dist_info / "RECORD").write_text(record)
    return dist_info


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


def fake_run(run_dir: Path, venv: str, **fields) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"name": run_dir.name, "status": "finished", "venv": venv, **fields}))
    (run_dir / "checkpoint.pt").write_bytes(b"not read before the venv is trusted")
    return run_dir


def interpreter_that_leaves_a_marker(venv: Path, marker: Path) -> None:
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "envkit.json").write_text(json.dumps({"profile": "cpu", "lock_digest": "0" * 64, "python": "3.11"}))


@pytest.mark.parametrize("where", ["relative", "inside"])
def test_export_never_runs_an_interpreter_the_run_dir_brings(tmp_path, where):
    run_dir = tmp_path / "handed" / "run"
    marker = tmp_path / "CODE-RAN"
    venv = "venv" if where == "relative" else str(run_dir / "venv")
    fake_run(run_dir, venv)
    interpreter_that_leaves_a_marker(run_dir / "venv", marker)
    proc = run_envkit("export", str(run_dir), "--out", str(tmp_path / "out"), cwd=run_dir)
    assert "venv" in one_line_error(proc)
    assert not marker.exists() and not (tmp_path / "out").exists()


# -- deletion ------------------------------------------------------------------------------------
def tiny_checkpoint(run_dir: Path) -> Path:
    pytest.importorskip("torch")
    from trainer.config import tiny
    from trainer.loop import Trainer

    cfg = tiny()
    cfg.data.num_sequences, cfg.data.eval_sequences, cfg.data.buckets = 8, 2, [64]
    cfg.steps, cfg.compile = 1, False
    trainer = Trainer.sequential(cfg, run_dir, log=lambda m: None)
    return trainer.save_checkpoint()


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "run")


def trainer_cmd(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=PROJECT,
                          timeout=timeout, **kwargs)


def test_export_force_replaces_only_what_its_manifest_lists(tmp_path, checkpoint_path):
    out = tmp_path / "export"
    assert trainer_cmd("export", "--ckpt", str(checkpoint_path), "--out", str(out)).returncode == 0
    (out / "my-notes.txt").write_text("mine")  # a file a user added to an old export
    proc = trainer_cmd("export", "--ckpt", str(checkpoint_path), "--out", str(out), "--force")
    assert "does not list" in one_line_error(proc)
    assert (out / "my-notes.txt").read_text() == "mine"
    users = tmp_path / "users-dir"  # a user's dir that merely holds a file of that name
    users.mkdir()
    (users / "envkit-export.json").write_text("{}")
    (users / "thesis.tex").write_text("years of work")
    proc = trainer_cmd("export", "--ckpt", str(checkpoint_path), "--out", str(users), "--force")
    one_line_error(proc)
    assert (users / "thesis.tex").read_text() == "years of work"
    (out / "my-notes.txt").unlink()  # a clean old export is replaced
    assert trainer_cmd("export", "--ckpt", str(checkpoint_path), "--out", str(out), "--force").returncode == 0


def test_export_follows_the_umask_refuses_a_linked_out_and_cleans_up_on_sigterm(tmp_path, checkpoint_path):
    out = tmp_path / "export"
    proc = trainer_cmd("export", "--ckpt", str(checkpoint_path), "--out", str(out), preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in out.rglob("*") if p.is_file())
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    proc = trainer_cmd("export", "--ckpt", str(checkpoint_path), "--out", str(link))
    assert "symlink" in one_line_error(proc) and not (tmp_path / "elsewhere").exists()
    # SIGTERM once the export is under way: its temporary directory goes with it.
    slow = subprocess.Popen([sys.executable, "-m", "trainer", "export", "--ckpt", str(checkpoint_path), "--out",
                             str(tmp_path / "killed")], cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".killed.tmp-*")) and time.monotonic() < deadline and slow.poll() is None:
        time.sleep(0.01)
    slow.send_signal(signal.SIGTERM)
    slow.wait(timeout=120)
    assert slow.returncode == 143, slow.stderr.read()[-2000:]
    assert not list(tmp_path.glob(".killed.tmp-*")) and not (tmp_path / "killed").exists()


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


def test_runs_lists_every_run_around_an_odd_or_hanging_run_json(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs / "good", "/nowhere", started_at="2026-01-01")
    (runs / "list").mkdir()
    (runs / "list" / "run.json").write_text("[1, 2]")
    fake_run(runs / "odd", "/nowhere", status=7, supervisor_pid="x", summary=[1], name=None)
    (runs / "fifo").mkdir()
    os.mkfifo(runs / "fifo" / "run.json")
    fake_run(runs / f"esc{ESC}[2Jname", "/nowhere", status=f"running{ESC}[31m")
    proc = subprocess.run([sys.executable, "-m", "envkit", "runs", "--runs-dir", str(runs)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert ESC not in proc.stdout
    names = [line.split()[0] for line in proc.stdout.splitlines()[1:]]
    assert {"good", "list", "odd", "fifo"} <= set(names)
    rows = json.loads(run_envkit("runs", "--runs-dir", str(runs), "--json").stdout)
    assert {r["name"]: r["status"] for r in rows}["list"] == "invalid"


# -- silent wrong results and tracebacks -----------------------------------------------------------
@pytest.mark.parametrize("change, needle", [
    ({"drafter": {"gamma": 0}}, "drafter.gamma must be greater than 0"),
    ({"grad_clip": -1}, "grad_clip must be greater than 0"),
    ({"walk_prompts": 0}, "walk_prompts must be at least 1"),
    ({"steps": 0}, "steps must be at least 1"),
    ({"log_every": 0}, "log_every must be at least 1"),
    ({"batch_size": 8.5}, "batch_size must be int"),
    ({"lm_head_chunk": 0}, "lm_head_chunk must be at least 1"),
    ({"lr": "fast"}, "lr must be float"),
])
def test_config_values_are_checked_where_they_are_read(tmp_path, change, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"preset": "tiny", **change}))
    assert needle in one_line_error(trainer_cmd("describe", "--config", str(path)))


def test_token_ids_are_checked_at_load_and_skip_bad_skips_them(tmp_path):
    data = tmp_path / "d.jsonl"
    good = {"input_ids": list(range(1, 40)), "loss_mask": [1] * 39}
    lines = [json.dumps(good)] * 30 + [json.dumps({"input_ids": [1, 2, 512, 3] * 10}),
                                       json.dumps({"input_ids": [-1] * 40})]
    data.write_bytes(("\n".join(lines) + "\n").encode() + b'{"input_ids": [1, 2, "\xff"]}\n')
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"preset": "tiny", "steps": 2, "compile": False, "eval_every": 0, "walk_prompts": 1,
                                  "walk_new_tokens": 8, "data": {"buckets": [64]}}))
    proc = trainer_cmd("train", "--config", str(config), "--data", str(data), "--out", str(tmp_path / "o"))
    assert f"{data}:31: malformed line (token id 512 is outside the vocabulary (0..511))" in one_line_error(proc)
    proc = trainer_cmd("train", "--config", str(config), "--data", str(data), "--out", str(tmp_path / "o2"),
                       "--skip-bad")
    assert proc.returncode == 0, proc.stderr[-2000:]
    non_utf8 = tmp_path / "bad.jsonl"
    non_utf8.write_bytes(b'{"input_ids": [1, 2]}\n{"input_ids": "\xff\xfe"}\n')
    assert f"{non_utf8}:2: malformed line" in one_line_error(trainer_cmd("train", "--config", str(config), "--data",
                                                                          str(non_utf8), "--out", str(tmp_path / "o3")))


def test_a_non_finite_loss_fails_the_run_naming_the_step(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"preset": "tiny", "steps": 50, "compile": False, "lr": 1e30, "warmup_frac": 0,
                                  "eval_every": 0, "log_every": 1, "data": {"buckets": [64], "num_sequences": 16}}))
    proc = trainer_cmd("train", "--config", str(config), "--out", str(tmp_path / "o"))
    error = one_line_error(proc)
    assert "the loss is" in error and "at step" in error
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("state, needle", [
    ({"step": 1}, "no valid 'config'"),
    ({"config": {}, "step": 1, "drafter": {"fuse.weight": "int"}, "layer_ids": [1], "mask_token_id": 0},
     "not a finite floating-point tensor"),
    ("pickle", "Weights only load failed"),
])
def test_crafted_checkpoints_are_one_line_errors(tmp_path, state, needle):
    torch = pytest.importorskip("torch")
    path = tmp_path / "checkpoint.pt"
    if state == "pickle":
        torch.save({"payload": os.system}, path)
    else:
        if isinstance(state.get("drafter"), dict):
            state["drafter"] = {"fuse.weight": torch.ones(2, dtype=torch.int64)}
        torch.save(state, path)
    assert needle in one_line_error(trainer_cmd("export", "--ckpt", str(path), "--out", str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_name_in_a_checkpoint_never_reaches_a_hub(tmp_path, checkpoint_path):
    torch = pytest.importorskip("torch")
    state = torch.load(checkpoint_path, weights_only=True)
    state["export"]["tokenizer"] = "Qwen/Qwen3-8B"
    crafted = tmp_path / "checkpoint.pt"
    torch.save(state, crafted)
    proc = trainer_cmd("export", "--ckpt", str(crafted), "--out", str(tmp_path / "out"),
                       env=dict(os.environ, HF_HUB_OFFLINE="0"))
    assert "not a local directory" in one_line_error(proc)


def test_envkit_train_refuses_trainer_flags_it_sets_itself(tmp_path):
    proc = run_envkit("train", "--venv", str(tmp_path / "nope"), "--", "--out", str(tmp_path / "elsewhere"))
    assert "set by envkit itself" in one_line_error(proc)
    proc = run_envkit("train", "--venv", str(tmp_path / "nope"), "--", "--out=x")
    assert "set by envkit itself" in one_line_error(proc)
    assert not (tmp_path / "elsewhere").exists()


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
