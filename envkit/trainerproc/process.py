"""The one way envkit runs the bundled trainer: `python -m trainer ...` in a venv's own interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from envkit import paths
from envkit.trainerproc import cacheenv
from envkit.errors import CacheError, EnvkitError
from envkit.trainerproc.isolation import without_engine_variables
from envkit.support.text import printable
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import die_with_parent


def trainer_command(venv: Venv, *args: str) -> list[str]:
    """`python -m trainer ARGS` with the venv's own interpreter (run, warm-up and train all start it so)."""
    return [str(venv.python), "-m", "trainer", *args]


def trainer_env(venv: Venv, cache_dir: Path | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the trainer runs with, from the user's (`environ`, default ours): the bundled trainer
    importable, the private cache (envkit/trainerproc/cacheenv.py)."""
    environ = without_engine_variables(os.environ if environ is None else environ)  # envkit/trainerproc/isolation.py
    env = cacheenv.apply(environ, cache_dir) if cache_dir is not None else environ
    env["PYTHONPATH"] = str(paths.trainer_root())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def trainer_args(preset: str | None, config: str | None) -> list[str]:
    return ["--config", str(Path(config).resolve())] if config else ["--preset", preset or paths.DEFAULT_PRESET]


def run_trainer(venv: Venv, args: list[str], env: dict[str, str], *, timeout: float | None = None,
                error: type[EnvkitError] = CacheError, ok_codes: tuple[int, ...] = (0,)):
    """Run to completion; an exit code outside `ok_codes` becomes `error` with the trainer's own `Error:` line."""
    proc = subprocess.run(trainer_command(venv, *args), capture_output=True, text=True, env=env,
                          timeout=timeout, preexec_fn=die_with_parent)
    if proc.returncode not in ok_codes:
        raise trainer_failure(venv, args, proc.stderr, error)
    return proc


def stream_trainer(venv: Venv, args: list[str], env: dict[str, str], *, shown: str,
                   error: type[EnvkitError] = CacheError) -> str:
    """Run to completion, echoing the trainer's stderr lines that start with `shown` (its progress) as they come;
    returns its stdout. A failure becomes `error` with the trainer's own `Error:` line, as run_trainer's."""
    proc = subprocess.Popen(trainer_command(venv, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=die_with_parent)
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
    reader.start()
    kept = []
    for line in proc.stderr:
        kept.append(line)
        del kept[:-200]  # the tail is enough to name a failure
        if line.startswith(shown):  # a prompt file's name is in it: escaped before a terminal sees it
            print(printable(line.rstrip("\n")), file=sys.stderr, flush=True)
    reader.join()
    if proc.wait() != 0:
        raise trainer_failure(venv, args, "".join(kept), error)
    return "".join(stdout)


def trainer_failure(venv: Venv, args: list[str], stderr: str, error: type[EnvkitError] = CacheError) -> EnvkitError:
    if "No module named 'torch'" in stderr:
        return error(f"{venv.path} has no torch; the trainer needs its environment: "
                     f"`envkit create --profile cpu` (or cuda) and pass its --venv")
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    message = next((line for line in reversed(lines) if line.startswith("Error: ")), None)
    if message:
        return error(message.removeprefix("Error: "))
    tail = "\n  ".join(lines[-8:])
    return error(f"`python -m trainer {args[0]}` failed in {venv.path}:\n  {tail}")


