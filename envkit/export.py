"""`envkit export`: a run's drafter in the DFlash serving format, written by the trainer in the run's venv."""

from __future__ import annotations

import json
from pathlib import Path

from envkit.errors import RunError
from envkit.rundir import RUN_JSON, read_run
from envkit.runs import find_run
from envkit.trainer_process import run_trainer, trainer_env
from envkit.venv import Venv


def resolve_run(run: str, runs_dir: Path | None = None) -> Path:
    """A run directory (holding run.json) or a name from `envkit runs`."""
    path = Path(run)
    if (path / RUN_JSON).is_file():
        return path.absolute()
    return find_run(run, runs_dir)


def export(run: str, out: Path, *, force: bool = False, dtype: str | None = None,
           runs_dir: Path | None = None) -> dict:
    run_dir = resolve_run(run, runs_dir)
    record = read_run(run_dir)
    ckpt = run_dir / "checkpoint.pt"
    if not ckpt.is_file():
        raise RunError(f"run {record.get('name', run_dir.name)} has no checkpoint.pt yet (status "
                       f"{record.get('status')}); export a run that has saved one")
    venv = Venv(Path(record.get("venv") or ""))
    if not venv.python.is_file():
        raise RunError(f"the run's venv {venv.path} is gone; recreate it with `envkit create --venv {venv.path}` "
                       f"(profile {record.get('profile')}) and export again")
    args = ["export", "--ckpt", str(ckpt), "--out", str(Path(out).absolute()), *(["--force"] if force else []),
            *(["--dtype", dtype] if dtype else [])]
    proc = run_trainer(venv, args, trainer_env(venv, None), error=RunError)
    return json.loads(proc.stdout.strip().splitlines()[-1])
