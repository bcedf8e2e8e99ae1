"""The supervisor of a run, in the foreground or detached (tmux, or a new session without tmux): it starts the
recorded command, tees its output into train.log, forwards Ctrl-C, SIGTERM and SIGHUP, and records the end."""

from __future__ import annotations

import codecs
import errno
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from envkit.trainerproc import cacheenv
from envkit.cache.fingerprint import write_fingerprint
from envkit.errors import RunError
from envkit.trainerproc import isolation
from envkit.run.rundir import LOG, NODE_JSON, now, read_node, read_run, read_summary, update_run
from envkit.support.progress import Phases
from envkit.support.text import printable
from envkit.trainerproc.process import trainer_env
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import die_with_parent

EXIT_STATUS = {0: "finished", 130: "interrupted", 143: "interrupted", -2: "interrupted", -15: "interrupted"}


def command_env(venv: Venv, cache_dir: Path, extra: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """What `envkit run` gives a command: the venv activated (its bin first on PATH), the private cache
    (envkit/trainerproc/cacheenv.py)."""
    env = cacheenv.apply(isolation.without_engine_variables(os.environ if environ is None else environ), cache_dir)
    env.pop("PYTHONHOME", None)
    env["VIRTUAL_ENV"] = str(venv.path)
    env["PATH"] = os.pathsep.join([str(venv.path / "bin"), env.get("PATH", os.defpath)])
    return env | extra


def process_env(record: dict, venv: Venv, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the run's process by its kind, from the user's: a server's has nothing of training
    (isolation.py)."""
    kind = record.get("kind")
    environ = dict(os.environ if environ is None else environ)
    if kind == "server":
        return isolation.server_env(environ, venv.path)
    if kind == "command":
        return command_env(venv, Path(record["cache_dir"]), record.get("env") or {}, environ)
    return trainer_env(venv, Path(record["cache_dir"]), environ)


def tmux_session_name(run_name: str) -> str:
    """tmux turns '.' and ':' into '_' in session names; a name that survives as given can be used to stop it."""
    base = "envkit-" + re.sub(r"[^A-Za-z0-9_-]", "_", run_name)
    name, suffix = base, 1
    while subprocess.run(["tmux", "has-session", "-t", f"={name}"], capture_output=True).returncode == 0:
        suffix += 1
        name = f"{base}-{suffix}"
    return name


def detach(run_dir: Path, phases: Phases, label: str, stop_hint: str | None = None) -> dict:
    """Start the supervisor in tmux (or a new session); it records its own pid and status in run.json.
    `stop_hint`: the command that stops it, where it has one of its own (`envkit serve --stop NAME`)."""
    supervisor = [sys.executable, "-m", "envkit", "supervise", str(run_dir)]
    follow = f"envkit logs {run_dir.name} -f"
    if shutil.which("tmux"):
        session = tmux_session_name(run_dir.name)
        # Written before the start, so that run.json has a single writer once the supervisor runs.
        update_run(run_dir, tmux_session=session)
        # A session that a running tmux server starts has that server's environment, not ours: ours is handed
        # over through a private FIFO (never argv, which every user can read, nor a file on disk).
        fifo = run_dir / ENVIRON_FIFO
        os.mkfifo(fifo, 0o600)
        try:
            started = subprocess.run(["tmux", "new-session", "-d", "-s", session,
                                      shlex.join([*supervisor, "--environ-fifo", str(fifo)])],
                                     capture_output=True, text=True)
            if started.returncode != 0:
                raise RunError(f"tmux could not start session {session}: {started.stderr.strip()}; run without "
                               f"--detach or fix tmux")
            _hand_environment(fifo)
        finally:
            fifo.unlink(missing_ok=True)
        where, follow, stop = f"tmux session {session}", f"tmux attach -t {session}  or  {follow}", \
            f"tmux send-keys -t {session} C-c"
    else:
        with open(os.devnull, "rb") as stdin, open(os.devnull, "wb") as devnull:
            proc = subprocess.Popen(supervisor, stdin=stdin, stdout=devnull, stderr=devnull, start_new_session=True)
        where, stop = f"a new session (pid {proc.pid}; tmux is not installed)", f"kill -TERM {proc.pid}"
    _wait_until_supervised(run_dir)
    phases.say(f"{label}: detached in {where}\n  follow: {follow}\n  stop:   {stop_hint or stop}")
    return read_run(run_dir) | {"run_dir": str(run_dir)}


ENVIRON_FIFO = ".environ.fifo"
ENVIRON_WAIT_S = 30.0


def _hand_environment(fifo: Path) -> None:
    """Write our environment into the FIFO once the detached supervisor opened it for reading."""
    deadline = time.monotonic() + ENVIRON_WAIT_S
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:  # ENXIO: no reader yet
                raise RunError(f"the detached supervisor did not take the environment within {ENVIRON_WAIT_S:.0f}s "
                               f"({exc.strerror}); see tmux") from None
            time.sleep(0.02)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as handle:
        handle.write(json.dumps(dict(os.environ)).encode())


def receive_environment(fifo: Path) -> dict[str, str]:
    """The launcher's environment, read from the FIFO it writes (detach's hand-over)."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    chunks: list[bytes] = []
    deadline = time.monotonic() + ENVIRON_WAIT_S
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunError(f"no environment arrived from the launcher within {ENVIRON_WAIT_S:.0f}s")
            ready, _, _ = select.select([fd], [], [], remaining)
            data = os.read(fd, 1 << 16) if ready else b""
            if data:
                chunks.append(data)
            elif chunks:
                break  # the launcher wrote it all and closed its end
            else:
                time.sleep(0.02)  # no writer yet
    finally:
        os.close(fd)
    environ = json.loads(b"".join(chunks))
    if not isinstance(environ, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
        raise RunError("the environment handed over is not a mapping of strings")
    return environ


def _wait_until_supervised(run_dir: Path, timeout: float = 30.0) -> None:
    """Return once the supervisor has taken the run over, so `starting` never outlives this process unnoticed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_run(run_dir).get("status") != "starting":
            return
        time.sleep(0.1)
    raise RunError(f"the detached supervisor did not start within {timeout:.0f}s; see {run_dir / LOG}")


def supervise(run_dir: Path, *, echo: bool, environ: dict[str, str] | None = None) -> dict:
    """Run the recorded command, tee its output to train.log, forward signals, record the end. `environ`: the
    environment of the user who started the run (a detached supervisor gets it from its launcher), else ours."""
    record = read_run(run_dir)
    venv = Venv(Path(record["venv"]))
    command_run = record.get("kind") == "command"
    env = process_env(record, venv, environ)
    if record.get("stop_requested"):  # stopped while it was starting: nothing is started
        return update_run(run_dir, status=record["stop_requested"], ended_at=now(), supervisor_pid=os.getpid(),
                          **({"error": record["stop_error"]} if record.get("stop_error") else {}))
    with (run_dir / LOG).open("ab") as log:
        # A session of its own: signals reach it only through us, once. It dies with us (SIGTERM, so it
        # checkpoints) rather than run on unsupervised.
        proc = subprocess.Popen(record["command"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                cwd=record.get("cwd"), start_new_session=True, preexec_fn=die_with_parent)
        if update_run(run_dir, status="running", pid=proc.pid, supervisor_pid=os.getpid()).get("stop_requested"):
            proc.terminate()  # asked to stop between the check above and the start

        def forward(signum, frame):
            if proc.poll() is None:
                proc.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        # The log keeps the bytes; the terminal gets them escaped (a file name the trainer echoes may hold ESC).
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in iter(lambda: proc.stdout.read1(65536), b""):
                log.write(chunk)
                log.flush()
                if echo:
                    sys.stdout.write(printable(decoder.decode(chunk), keep_newlines=True))
                    sys.stdout.flush()
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    status = EXIT_STATUS.get(code, "failed")
    fields = {"node": read_node(run_dir)} if (run_dir / NODE_JSON).exists() else {}
    asked = read_run(run_dir)
    if asked.get("stop_requested"):  # `serve --stop`, or a server that never served: the end asked for
        status = asked["stop_requested"]
        if asked.get("stop_error"):
            fields["error"] = asked["stop_error"]
    elif status == "failed":
        what = {"command": "the command", "server": "the server"}.get(record.get("kind"), "the trainer")
        fields["error"] = worker_failure(run_dir / LOG) or f"{what} exited {code}; see {run_dir / LOG}"
    if command_run and status == "finished":
        # What the command compiled is vouched for from here on: a later run verifies it before starting.
        fields["cache_fingerprint"] = write_fingerprint(Path(record["cache_dir"]), record["key_parts"], [], {},
                                                        venv)["digest"]
    return update_run(run_dir, status=status, exit_code=code, ended_at=now(), summary=read_summary(run_dir), **fields)


def worker_failure(log: Path) -> str | None:
    """torchrun's account of the first worker that failed ('Root Cause' in its report): rank, host, exit."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - (256 << 10)))
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    block = text.rpartition("Root Cause (first observed failure):")[2]
    fields = dict(re.findall(r"^\s*(rank|host|exitcode)\s*:\s*(.+?)\s*$", block, re.M))
    if not block or "rank" not in fields:
        return None
    return printable(f"worker rank {fields['rank']} on host {fields.get('host', '?')} failed: exit code "
                     f"{fields.get('exitcode', '?')}; the run stopped (torchrun --max-restarts lets it survive)")


