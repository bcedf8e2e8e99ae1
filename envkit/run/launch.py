"""`envkit train`: preflight (create, doctor, cache), then the bundled trainer in a run directory, supervised
(envkit/run/supervise.py) in the foreground or detached."""

from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from envkit.cache.key import describe
from envkit.errors import RunError
from envkit.run.preflight import (git_commit, new_run_dir, note_cache_overrides, preflight_cache, preflight_doctor,
                                  preflight_venv, versions)
from envkit.run.rundir import CONFIG_JSON, LOG, RUN_JSON, boot_id, end_recorded_if_unsupervised, now, update_run
from envkit.run.supervise import detach, supervise
from envkit.support.fsops import write_json_atomic
from envkit.support.progress import Phases
from envkit.support.text import printable
from envkit.trainerproc.pretrained_target import fetch
from envkit.trainerproc.process import trainer_command
from envkit.support.trainer_helpers import details
from envkit.support.trainer_helpers import pretrained


@dataclass(frozen=True)
class TrainRequest:
    venv_path: str | None
    profile_name: str | None
    preset: str | None
    config: str | None
    name: str | None
    runs_dir: str | None
    detach: bool
    no_warm: bool
    allow_warn: bool
    trainer_args: tuple[str, ...]
    launch: tuple[str, ...] = ()  # torchrun's options (--nproc-per-node, --nnodes, ...), handed to the trainer


def launch_args(*, nproc_per_node=None, nnodes=None, node_rank=None, rdzv_endpoint=None, rdzv_id=None,
                max_restarts=None) -> tuple[str, ...]:
    """torchrun's options as trainer arguments; several nodes need a rendezvous endpoint."""
    if (nnodes or 1) > 1 and not rdzv_endpoint:
        raise RunError("--nnodes N > 1 needs --rdzv-endpoint HOST:PORT (node 0's address, the same on every node)")
    if rdzv_endpoint and not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}", rdzv_endpoint):
        raise RunError(f"--rdzv-endpoint {printable(rdzv_endpoint)!r} is not HOST:PORT")
    if node_rank is not None and nnodes and node_rank >= nnodes:
        raise RunError(f"--node-rank {node_rank} is not below --nnodes {nnodes}")
    values = {"--nproc-per-node": nproc_per_node, "--nnodes": nnodes, "--node-rank": node_rank,
              "--rdzv-endpoint": rdzv_endpoint, "--rdzv-id": rdzv_id if rdzv_endpoint else None,
              "--max-restarts": max_restarts}
    return tuple(arg for flag, value in values.items() if value is not None for arg in (flag, str(value)))


def start(request: TrainRequest, *, quiet: bool = False) -> dict:
    """Preflight, resolve the config once into RUN_DIR/config.json, warm for it, run (or detach) the trainer.

    Describe, warm-up and train all read that one file, so the env key and the compiled shapes are
    those of the run (`-- --batch-size 4` included). Returns the final run.json.
    """
    _check_trainer_args(request.trainer_args)
    phases = Phases(total=5 + (request.preset in pretrained.PRESET_TARGETS), quiet=quiet)
    if request.name:  # before minutes of preflight, not after
        new_run_dir(request.name, request.runs_dir, "")
    venv = preflight_venv(request.venv_path, request.profile_name, phases)
    profile = preflight_doctor(venv, request.profile_name, request.allow_warn, phases)
    if request.preset in pretrained.PRESET_TARGETS:  # a pretrained target is fetched and converted once, before the trainer
        with phases.phase("target", pretrained.PRESET_TARGETS[request.preset]):
            fetch(request.preset, quiet=True)
    described = describe(venv, request.preset, request.config, request.trainer_args)
    run_dir = new_run_dir(request.name, request.runs_dir, described["preset"])
    try:
        run_dir.mkdir(parents=True)
    except OSError as exc:
        raise RunError(f"cannot create the run dir {run_dir}: {exc.strerror}; give --runs-dir a writable dir") from None
    config_path = run_dir / CONFIG_JSON
    write_json_atomic(config_path, described["full_config"])
    command = trainer_command(venv, "train", "--config", str(config_path), "--out", str(run_dir),
                              *request.launch, *request.trainer_args)
    record = {
        "name": run_dir.name, "status": "starting", "config": described["full_config"],
        "config_path": str(config_path), "profile": profile.name if profile else None,
        "lock_digest": profile.lock_digest if profile else None, "venv": str(venv.path),
        "versions": versions(venv), "git_commit": git_commit(), "command": command,
        "envkit_command": sys.argv, "host": socket.gethostname(), "boot_id": boot_id(), "started_at": now(), "ended_at": None,
        "exit_code": None, "detached": request.detach,
        "launcher_pid": os.getpid(),  # a `starting` run whose launcher and supervisor are gone is lost
    }
    write_json_atomic(run_dir / RUN_JSON, record)
    with end_recorded_if_unsupervised(run_dir):
        cache_dir, fingerprint = preflight_cache(venv, phases, described, config_path, no_warm=request.no_warm,
                                                 layout=request.trainer_args)
        update_run(run_dir, env_key=cache_dir.name, cache_dir=str(cache_dir), cache_fingerprint=fingerprint,
                   env_overridden=note_cache_overrides(cache_dir, phases), preflight_s=phases.timings)
        if request.detach:
            return detach(run_dir, phases, "[5/5] train")
        phases.say(f"[5/5] train: {run_dir} (log: {run_dir / LOG})")
        return supervise(run_dir, echo=not quiet) | {"run_dir": str(run_dir)}


# Trainer flags that envkit sets itself: given after `--` they would send outputs or config elsewhere while
# run.json records this run dir.
RESERVED_TRAINER_FLAGS = {"--out": "the run dir is envkit's (--name, --runs-dir)",
                          "--config": "give `envkit train --config FILE`", "--preset": "give `envkit train --preset NAME`"}


def _check_trainer_args(args: tuple[str, ...]) -> None:
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_TRAINER_FLAGS:
            raise RunError(f"`-- {flag}` is set by envkit itself ({RESERVED_TRAINER_FLAGS[flag]}); nothing was started")


def describe_summary(record: dict, run_dir: Path) -> str:
    summary = record.get("summary")
    lines = [printable(f"run {record.get('name')}: {record.get('status')} (exit {record.get('exit_code')}); "
                       f"run dir {run_dir}")]
    if record.get("error") and record["status"] == "failed":
        lines.append(f"  {printable(record['error'])}")
    node = record.get("node") or {}
    if node and not summary and record["status"] == "finished" and not node.get("writer"):
        lines.append(f"  node {node.get('group_rank')} of {node.get('nnodes')}: the writer (global rank 0) ran on "
                     f"another node; metrics, checkpoints and the summary are in that node's run dir")
    if summary:
        lines += details(summary)
    return "\n".join(lines)
