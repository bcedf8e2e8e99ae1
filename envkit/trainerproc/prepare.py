"""`envkit data prepare`: a data file's token store, prepared by the trainer in the managed venv."""

from __future__ import annotations

import subprocess
import sys

from envkit.errors import RunError
from envkit.support.text import printable
from envkit.trainerproc.process import trainer_command, trainer_env, trainer_failure
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import die_with_parent
from envkit.support.trainer_helpers import loads_json


def prepare(venv: Venv, args: list[str]) -> dict:
    """`python -m trainer prepare ARGS --json` in the venv; its progress lines are shown as they come."""
    command = trainer_command(venv, "prepare", *args, "--json")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=trainer_env(venv, None), preexec_fn=die_with_parent)
    stderr = []
    for line in proc.stderr:
        stderr.append(line)
        if line.startswith("prepare: "):
            print(printable(line.rstrip("\n")), file=sys.stderr, flush=True)
    stdout = proc.stdout.read()
    if proc.wait() != 0:
        raise trainer_failure(venv, ["prepare"], "".join(stderr), RunError)
    try:
        return loads_json(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RunError(f"`python -m trainer prepare` in {venv.path} printed no result") from None
