"""`envkit export` treats a run dir as data: no interpreter it brings is run, --force replaces only what the
export's manifest lists (never a hand edit), the umask is followed, a linked-out DIR is refused, SIGTERM cleans up."""

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

from helpers import PROJECT, fake_run, one_line_error, run_envkit, run_trainer


def interpreter_that_leaves_a_marker(venv: Path, marker: Path) -> None:
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "envkit.json").write_text(json.dumps({"profile": "cpu", "lock_digest": "0" * 64, "python": "3.11"}))


# `python -m trainer` with the export held just before it renames its temporary directory into place: it touches
# argv[1], then waits for a signal (the real export, the real handler; only the timing is the test's).
HELD_BEFORE_PLACING = """
import sys, time
from pathlib import Path
import trainer.export.dflash as dflash
from trainer.__main__ import main

def held(tmp, out, force):
    Path(sys.argv[1]).touch()
    time.sleep(600)
    raise AssertionError("no signal came")

dflash.place = held
sys.exit(main(sys.argv[2:]))
"""


# -- deletion ------------------------------------------------------------------------------------


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


def test_export_force_replaces_only_what_its_manifest_lists(tmp_path, checkpoint_path):
    out = tmp_path / "export"
    assert run_trainer("export", "--ckpt", str(checkpoint_path), "--out", str(out)).returncode == 0
    (out / "my-notes.txt").write_text("mine")  # a file a user added to an old export
    proc = run_trainer("export", "--ckpt", str(checkpoint_path), "--out", str(out), "--force")
    assert "does not list" in one_line_error(proc)
    assert (out / "my-notes.txt").read_text() == "mine"
    users = tmp_path / "users-dir"  # a user's dir that merely holds a file of that name
    users.mkdir()
    (users / "envkit-export.json").write_text("{}")
    (users / "thesis.tex").write_text("years of work")
    proc = run_trainer("export", "--ckpt", str(checkpoint_path), "--out", str(users), "--force")
    one_line_error(proc)
    assert (users / "thesis.tex").read_text() == "years of work"
    (out / "my-notes.txt").unlink()  # a clean old export is replaced
    assert run_trainer("export", "--ckpt", str(checkpoint_path), "--out", str(out), "--force").returncode == 0


def test_export_follows_the_umask_refuses_a_linked_out_and_cleans_up_on_sigterm(tmp_path, checkpoint_path):
    out = tmp_path / "export"
    proc = run_trainer("export", "--ckpt", str(checkpoint_path), "--out", str(out), preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in out.rglob("*") if p.is_file())
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    proc = run_trainer("export", "--ckpt", str(checkpoint_path), "--out", str(link))
    assert "symlink" in one_line_error(proc) and not (tmp_path / "elsewhere").exists()
    # SIGTERM once the export is under way, held (so the signal cannot come too late) right before its
    # temporary directory would be renamed into place: the directory goes with it.
    ready = tmp_path / "ready"
    slow = subprocess.Popen([sys.executable, "-c", HELD_BEFORE_PLACING, str(ready), "export", "--ckpt",
                             str(checkpoint_path), "--out", str(tmp_path / "killed")],
                            cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not ready.exists() and time.monotonic() < deadline and slow.poll() is None:
        time.sleep(0.01)
    assert list(tmp_path.glob(".killed.tmp-*")), slow.stderr.read()[-2000:] if slow.poll() is not None else ""
    slow.send_signal(signal.SIGTERM)
    slow.wait(timeout=120)
    assert slow.returncode == 143, slow.stderr.read()[-2000:]
    assert not list(tmp_path.glob(".killed.tmp-*")) and not (tmp_path / "killed").exists()


# -- nothing lost, nothing left behind ----------------------------------------------------------------------
def test_export_force_never_deletes_a_hand_edit(tmp_path, finished_run):
    out = tmp_path / "export"
    ckpt = str(finished_run / "checkpoint.pt")
    assert run_trainer("export", "--ckpt", ckpt, "--out", str(out)).returncode == 0
    (out / "README.md").write_text((out / "README.md").read_text() + "\nmy serving notes\n")
    error = one_line_error(run_trainer("export", "--ckpt", ckpt, "--out", str(out), "--force"))
    assert "README.md" in error and "changed since the export" in error
    assert "my serving notes" in (out / "README.md").read_text()
