"""`envkit serve`: a serving engine's OpenAI-compatible server, started from a serve venv as a supervised run.

A server is a run like any other (run.py's preflight, run dir, supervisor, detach): the venv must be a serve venv
and doctor-clean as one, the engine starts with an environment that carries nothing of training
(envkit/trainerproc/isolation.py), and it counts as started only once `/v1/models` lists the model. A start that fails or
times out is one line with the log's last lines, and nothing is left running. `--stop NAME` ends it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from envkit.support import state
from envkit.venv import record as venvrecord
from envkit.errors import RunError
from envkit.run.preflight import new_run_dir, preflight_doctor, preflight_venv, versions
from envkit.run.rundir import (LOG, RUN_JSON, boot_id, end_recorded_if_unsupervised, now, read_run, request_stop,
                               update_run)
from envkit.run.history import alive, find_run, status_of
from envkit.run.supervise import detach, supervise
from envkit.serve.engines import pick
from envkit.support.fsops import write_json_atomic
from envkit.support.progress import Phases
from envkit.support.text import printable
from envkit.support.trainer_helpers import TrainerInputError
from envkit.support.trainer_helpers import source_sha256

READY_POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
STOP_WAIT_S = 30.0


@dataclass(frozen=True)
class ServeRequest:
    venv_path: str
    model_dir: str
    engine: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    name: str | None = None
    runs_dir: str | None = None
    detach: bool = False
    allow_warn: bool = False
    ready_timeout: float = 600.0
    engine_args: tuple[str, ...] = ()


def model_digest(model: Path) -> str:
    """sha256 over the model dir's files (names, sizes, contents; a link by its target text), each file's digest
    remembered while its stat is unchanged (a 16 GB checkpoint is read once, not at every start)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model.rglob("*") if not p.is_dir() or p.is_symlink()):
        relative = path.relative_to(model).as_posix()
        if path.is_symlink():
            digest.update(f"{relative}\0link\0{os.readlink(path)}\0".encode())
        elif path.is_file():
            try:
                file_digest = source_sha256(path, state.state_dir() / "model-files")
            except TrainerInputError as exc:
                raise RunError(f"{exc}; start the server once the model dir is written") from None
            digest.update(f"{relative}\0{path.stat().st_size}\0{file_digest}\0".encode())
    return digest.hexdigest()


def _check_model(model_dir: str) -> Path:
    model = Path(model_dir).expanduser().absolute()
    if not (model / "config.json").is_file():
        raise RunError(f"--model {printable(model_dir)}: not a model dir (no config.json); give a local Hugging Face "
                       f"model directory")
    return model


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise RunError(f"cannot serve on {host}:{port} ({exc.strerror}); choose another --port") from None


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def listed_models(url: str, timeout: float = 2.0) -> list[str] | None:
    """The model ids `/v1/models` lists, or None while the server does not answer it."""
    import httpx  # only the commands that talk to a server pay its import

    try:
        reply = httpx.get(f"{url}/v1/models", timeout=timeout)
        data = reply.json().get("data") if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return [str(entry.get("id")) for entry in data if isinstance(entry, dict)] if isinstance(data, list) else None


def log_tail(run_dir: Path, lines: int = 8) -> str:
    try:
        with (run_dir / LOG).open("rb") as handle:
            handle.seek(max(0, (run_dir / LOG).stat().st_size - (64 << 10)))
            text = handle.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n  ".join(printable(line) for line in kept) or "(empty log)"


def wait_ready(run_dir: Path, url: str, model_id: str, timeout: float, phases: Phases) -> None:
    """Return once `/v1/models` lists the model; a server that exits or stays unready past `timeout` is stopped
    and becomes one error with its log's last lines."""
    started = time.monotonic()
    last_said = started
    while True:
        models = listed_models(url)
        if models is not None and model_id in models:
            return
        record = read_run(run_dir)
        waited = time.monotonic() - started
        if record.get("status") not in ("starting", "running") or status_of(record) == "lost":
            raise RunError(f"the {record.get('engine')} server exited before it served {model_id} ({record.get('status')}, "
                           f"exit {record.get('exit_code')}); its log ({run_dir / LOG}) ends:\n  {log_tail(run_dir)}")
        if models is not None and waited > 30 and model_id not in models:
            raise _stopped(run_dir, f"the server at {url} answers but lists {printable(models[:5])}, not {model_id}; "
                                    f"stopped it")
        if waited > timeout:
            raise _stopped(run_dir, f"the server did not list {model_id} at {url}/v1/models within {timeout:.0f}s; "
                                    f"stopped it (--ready-timeout waits longer); its log ({run_dir / LOG}) ends:\n  "
                                    f"{log_tail(run_dir)}")
        if time.monotonic() - last_said >= PROGRESS_EVERY_S:
            phases.say(f"serve: waiting for {url}/v1/models to list the model ({waited:.0f}s)")
            last_said = time.monotonic()
        time.sleep(READY_POLL_S)


def _stopped(run_dir: Path, message: str) -> RunError:
    """Stop a server that will not serve, recorded as failed with why; the error to raise."""
    stop_run(run_dir, "failed", message)
    return RunError(message)


def start_server(request: ServeRequest, *, quiet: bool = False) -> dict:
    """Preflight the serve venv, start the engine in a run dir, return run.json once it serves the model
    (detached), or when it ends (in the foreground)."""
    phases = Phases(total=4, quiet=quiet)
    if request.name:
        new_run_dir(request.name, request.runs_dir, "serve")
    if not Path(request.venv_path).expanduser().exists():
        raise RunError(f"--venv {printable(request.venv_path)} does not exist; make a serve venv first: "
                       f"`envkit create --profile serve-cpu --venv {printable(request.venv_path)}`")
    model = _check_model(request.model_dir)
    venv = preflight_venv(request.venv_path, None, phases, role="serve")
    profile = preflight_doctor(venv, None, request.allow_warn, phases)
    role = venvrecord.role_of(venv, profile)
    engine, engine_version = pick(request.engine, role.engine, venv)
    _check_port(request.host, request.port)
    with phases.phase("model", str(model)):
        digest = model_digest(model)
    run_dir = new_run_dir(request.name, request.runs_dir, "serve")
    run_dir.mkdir(parents=True)
    url, model_id = base_url(request.host, request.port), str(model)
    write_json_atomic(run_dir / RUN_JSON, {
        "name": run_dir.name, "kind": "server", "status": "starting", "engine": engine.name,
        "engine_version": engine_version, "model": model_id, "model_digest": digest, "bind": request.host,
        "port": request.port, "url": url, "command": engine.command(venv, model, request.host, request.port,
                                                                     request.engine_args),
        "cwd": os.getcwd(), "profile": profile.name if profile else None,
        "lock_digest": profile.lock_digest if profile else None, "venv": str(venv.path), "versions": versions(venv),
        "envkit_command": sys.argv, "host": socket.gethostname(), "boot_id": boot_id(), "started_at": now(),
        "ended_at": None, "exit_code": None, "detached": request.detach, "launcher_pid": os.getpid(),
        "preflight_s": phases.timings})
    stop_hint = f"envkit serve --stop {run_dir.name}"
    with end_recorded_if_unsupervised(run_dir):
        if request.detach:
            detach(run_dir, phases, f"[4/4] serve {engine.name} {engine_version}", stop_hint)
            wait_ready(run_dir, url, model_id, request.ready_timeout, phases)
            phases.say(f"serve: {url}/v1 serves {model_id}\n  stop:   {stop_hint}")
            return read_run(run_dir) | {"run_dir": str(run_dir)}
        return _foreground(run_dir, url, model_id, request.ready_timeout, phases, quiet)


def _foreground(run_dir: Path, url: str, model_id: str, timeout: float, phases: Phases, quiet: bool) -> dict:
    """Supervise here; a watcher says when the model is served, or stops a server that never serves it."""
    failure: list[str] = []

    def watch() -> None:
        try:
            wait_ready(run_dir, url, model_id, timeout, phases)
            phases.say(f"serve: {url}/v1 serves {model_id} (Ctrl-C stops it)")
        except RunError as exc:
            failure.append(str(exc))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    record = supervise(run_dir, echo=not quiet) | {"run_dir": str(run_dir)}
    watcher.join(timeout=STOP_WAIT_S + 5)  # it may be stopping the engine: its error is the run's
    if failure:
        raise RunError(failure[0])
    return record


def stop_run(run_dir: Path, status: str = "stopped", error: str | None = None) -> dict:
    """End a server as `status`, whatever it is doing: the request is recorded first (a supervisor that has not
    started the engine yet then never does), then SIGTERM goes to the supervisor, which passes it on and records
    the end asked for; SIGKILL and an end recorded here only for one that does neither within STOP_WAIT_S."""
    request_stop(run_dir, status, error)
    deadline = time.monotonic() + STOP_WAIT_S
    signalled = False
    while time.monotonic() < deadline:
        record = read_run(run_dir)
        if record.get("status") not in ("starting", "running"):
            return record  # the supervisor recorded the end
        if status_of(record) == "lost":
            break
        supervisor, server = record.get("supervisor_pid"), record.get("pid")
        target = server if supervisor == os.getpid() else supervisor  # a foreground server's supervisor is us
        if not signalled and record.get("status") == "running" and alive(target):
            os.kill(target, signal.SIGTERM)
            signalled = True
        time.sleep(0.1)
    record = read_run(run_dir)
    for pid in (record.get("pid"), record.get("supervisor_pid")):
        if pid != os.getpid() and alive(pid):
            os.kill(pid, signal.SIGKILL)
    return update_run(run_dir, status=status, ended_at=record.get("ended_at") or now(),
                      **({"error": error} if error else {}))


def stop_server(name: str, runs_dir: str | None = None) -> dict:
    run_dir = find_run(name, Path(runs_dir) if runs_dir else None)
    record = read_run(run_dir)
    if record.get("kind") != "server":
        raise RunError(f"run {printable(name)!r} is not a server (it is a {printable(record.get('kind', 'train'))} run); "
                       f"stop a training run with Ctrl-C or `kill -TERM` of its supervisor")
    if status_of(record) not in ("running", "starting"):
        return record | {"run_dir": str(run_dir), "already": status_of(record)}
    return stop_run(run_dir) | {"run_dir": str(run_dir)}
