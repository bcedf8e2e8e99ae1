"""`envkit export`: a run's drafter in the DFlash serving format, written by the trainer in the run's venv."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from envkit.doctor.startup import interpreter_problem
from envkit.errors import RunError, VenvError
from envkit.run.rundir import RUN_JSON, read_run
from envkit.run.history import find_run
from envkit.support.text import printable
from envkit.trainerproc.process import run_trainer, trainer_env
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import permission_problem


def resolve_run(run: str, runs_dir: Path | None = None) -> Path:
    """A run directory (holding run.json) or a name from `envkit runs`."""
    path = Path(run)
    if (path / RUN_JSON).exists() or (path / RUN_JSON).is_symlink():
        return path.absolute()
    return find_run(run, runs_dir)


def run_venv(record: dict, run_dir: Path) -> Venv:
    """The venv the run recorded, trusted only as what envkit writes there: an absolute path to a venv envkit
    made, outside the run dir. A handed-over run dir must not choose the interpreter that runs."""
    recorded = record.get("venv")
    if not isinstance(recorded, str) or not Path(recorded).is_absolute() or "\0" in recorded:
        raise RunError(f"{printable(run_dir / RUN_JSON)} names no absolute venv path ({printable(recorded)!r:.200}); "
                       f"it was not written by envkit")
    venv = Venv(Path(recorded))
    real = venv.path.resolve()
    if real == run_dir.resolve() or run_dir.resolve() in real.parents:
        raise RunError(f"the run's venv {printable(venv.path)} lies inside the run dir: a run dir never brings its "
                       f"own interpreter; export with a run envkit started")
    if not venv.python.exists():
        raise RunError(f"the run's venv {printable(venv.path)} is gone; recreate it with `envkit create --venv "
                       f"{shlex.quote(str(venv.path))}` (profile {printable(record.get('profile'))}) and export again")
    # Its marker and interpreter are only envkit's if no one else could have written them.
    for entry in (venv.path, venv.path / "bin", venv.manifest_path, venv.path / "pyvenv.cfg"):
        problem = permission_problem(entry) if os.path.lexists(entry) else "missing"
        if problem:
            raise RunError(f"the run's venv {printable(venv.path)} is not one envkit would run: "
                           f"{printable(entry.name)} is {printable(problem)}; export runs only in a venv you own")
    try:
        made_by_envkit = venv.is_venv() and venv.manifest() is not None
    except VenvError:
        made_by_envkit = False
    if not made_by_envkit:
        raise RunError(f"the run's venv {printable(venv.path)} was not made by envkit (no envkit.json); export runs "
                       f"only in a venv envkit created")
    problem = interpreter_problem(venv, venv.python)
    if problem:
        raise RunError(f"the run's venv {printable(venv.path)}: bin/python {problem}; nothing was run")
    return venv


def export(run: str, out: Path, *, force: bool = False, dtype: str | None = None,
           runs_dir: Path | None = None) -> dict:
    run_dir = resolve_run(run, runs_dir)
    record = read_run(run_dir)
    ckpt = run_dir / "checkpoint.pt"
    if not ckpt.is_file() or ckpt.is_symlink():
        raise RunError(f"run {printable(run_dir.name)} has no checkpoint.pt yet (status "
                       f"{printable(record.get('status'))}); export a run that has saved one")
    venv = run_venv(record, run_dir)
    args = ["export", "--ckpt", str(ckpt), "--out", str(Path(out).absolute()), *(["--force"] if force else []),
            *(["--dtype", dtype] if dtype else [])]
    proc = run_trainer(venv, args, trainer_env(venv, None), error=RunError)
    return json.loads(proc.stdout.strip().splitlines()[-1])
