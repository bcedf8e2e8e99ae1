"""`envkit train`: preflight (create, doctor, cache), then the bundled trainer in a run directory.

A run is supervised by one function whether it runs in the foreground or detached (tmux, or a new
session when tmux is absent): it tees the trainer's output into train.log, forwards Ctrl-C and
SIGTERM to the trainer (which checkpoints), and records the end in run.json.
"""

from __future__ import annotations

import codecs
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from envkit import __version__, doctor, paths, selftest
from envkit.cache import warmup
from envkit.cache.fingerprint import read_fingerprint, tampered_names
from envkit.cache.key import compile_root, describe, ensure_private_dir, env_key, key_parts
from envkit.doctor.findings import Report, Status
from envkit.errors import RunError
from envkit.text import printable
from envkit.installed import installed_versions
from envkit.progress import Phases
from envkit.run.rundir import (CONFIG_JSON, boot_id, LOG, NODE_JSON, RUN_JSON, check_run_name, now, read_node, read_run,
                           read_summary, update_run)
from envkit.trainer_process import trainer_command, trainer_env
from envkit.trainer_source import trainer_digest
from envkit.uvtool import uv_version
from envkit.fsops import write_json_atomic
from envkit.venv import Venv
from trainer.children import die_with_parent
from trainer.records import details

# Warnings that `envkit train` itself resolves: it warms a cold cache and runs the hazard self-tests that
# have not run in this venv yet (a failed self-test is a fail finding, which stops the run).
HANDLED_WARNINGS = {"cache.fingerprint", "torch.hazard"}
EXIT_STATUS = {0: "finished", 130: "interrupted", 143: "interrupted", -2: "interrupted", -15: "interrupted"}


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


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(paths.PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _versions(venv: Venv) -> dict:
    installed = installed_versions(venv.site_packages())
    return {"envkit": __version__, "python": venv.python_version(), "uv": uv_version(),
            **{name: installed.get(name) for name in ("torch", "transformers", "triton")}}


def _blocking(report: Report, allow_warn: bool) -> list:
    """Findings that stop a run: every fail, and warnings train does not handle unless --allow-warn."""
    return [f for f in report.findings if f.status == Status.FAIL
            or (f.status == Status.WARN and not allow_warn and f.id not in HANDLED_WARNINGS)]


def _preflight_venv(request: TrainRequest, phases: Phases) -> Venv:
    from envkit.create import create

    profile_name = request.profile_name or paths.DEFAULT_PROFILE
    path = Path(request.venv_path) if request.venv_path else paths.default_venv(profile_name)
    venv = Venv(path.expanduser().absolute())
    if not venv.path.exists():
        with phases.phase("create", f"{venv.path} from profile {profile_name}"):
            create(profile_name, None, venv.path)
    else:
        with phases.phase("create", f"{venv.path} exists"):
            venv.require()
    return venv


def _preflight_doctor(venv: Venv, request: TrainRequest, phases: Phases):
    from envkit.doctor.render import as_table

    with phases.phase("doctor"):
        ctx = doctor.load_context(venv.path, request.profile_name if request.profile_name else None)
        report = doctor.diagnose(ctx)
    blocking = _blocking(report, request.allow_warn)
    if blocking:
        shown = Report(report.venv, report.profile, tuple(blocking), report.skipped)
        raise RunError("doctor found problems; nothing was started:\n" + as_table(shown, colour=False, show_ok=False)
                       + ("\n(warnings only? --allow-warn starts anyway)" if all(f.status == Status.WARN
                                                                                  for f in blocking) else ""))
    return ctx.profile


def _preflight_cache(venv: Venv, request: TrainRequest, phases: Phases, described: dict,
                     config_path: Path) -> tuple[Path, str | None]:
    if not described["config"].get("compile"):
        # Nothing is compiled, so nothing to warm or verify; the private dir still keeps torch out of /tmp.
        cache_dir = compile_root() / env_key(key_parts(venv, None, str(config_path), described))
        ensure_private_dir(cache_dir)
        _prove_mitigations(venv, cache_dir, described["torch"], phases)
        return cache_dir, None
    with phases.phase("cache", "verify"):
        result = warmup.verify(venv, None, str(config_path), described)
    if result.tampered:
        raise RunError(f"the compile cache {result.cache_dir} changed since it was fingerprinted or holds entries no "
                       f"fingerprint can vouch for ({tampered_names(result)}); remove it and run `envkit warm-cache`")
    if not result.fingerprinted:
        if request.no_warm:
            raise RunError(f"the compile cache for this run's config is cold (env key {result.env_key}); run "
                           f"`envkit warm-cache --venv {shlex.quote(str(venv.path))} --config {shlex.quote(str(config_path))}` first, or drop --no-warm")
        with phases.phase("warm-cache", f"cold env key {result.env_key}"):
            warmup.warm(venv, None, str(config_path), described=described, quiet=not sys.stderr.isatty(),
                       layout=warmup.layout_args(request.trainer_args))
    _prove_mitigations(venv, Path(result.cache_dir), described["torch"], phases)
    fingerprint = read_fingerprint(Path(result.cache_dir))
    return Path(result.cache_dir), fingerprint["digest"]


def _prove_mitigations(venv: Venv, cache_dir: Path, torch_version: str, phases: Phases) -> None:
    """The hazard self-tests, when this venv has no record for this torch and trainer; a failure stops the run."""
    record = selftest.read(venv)
    if not selftest.is_current(venv, torch_version, trainer_digest()):  # warm-cache ran them, else here
        with phases.phase("self-test", "hazard mitigations, first time in this venv"):
            record = warmup.prove_mitigations(venv, cache_dir, torch_version)
    failed = [f"{hazard} ({result.get('detail')})" for hazard, result in (record or {}).get("results", {}).items()
              if not result.get("passed")]
    if failed:
        raise RunError(f"the trainer's hazard mitigations failed their self-tests in {venv.path}: {'; '.join(failed)}; "
                       f"nothing was started (HAZARDS.md)")


def _run_dir(request: TrainRequest, preset: str) -> Path:
    name = check_run_name(request.name or f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{preset}")
    root = Path(request.runs_dir) if request.runs_dir else paths.runs_dir()
    run_dir = root / name
    if run_dir.exists() or run_dir.is_symlink():
        raise RunError(f"run dir {run_dir} already exists; choose another --name")
    return run_dir


def start(request: TrainRequest, *, quiet: bool = False) -> dict:
    """Preflight, resolve the config once into RUN_DIR/config.json, warm for it, run (or detach) the trainer.

    Describe, warm-up and train all read that one file, so the env key and the compiled shapes are
    those of the run (`-- --batch-size 4` included). Returns the final run.json.
    """
    _check_trainer_args(request.trainer_args)
    phases = Phases(total=5, quiet=quiet)
    if request.name:  # before minutes of preflight, not after
        _run_dir(request, "")
    venv = _preflight_venv(request, phases)
    profile = _preflight_doctor(venv, request, phases)
    described = describe(venv, request.preset, request.config, request.trainer_args)
    run_dir = _run_dir(request, described["preset"])
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
        "versions": _versions(venv), "git_commit": _git_commit(), "command": command,
        "envkit_command": sys.argv, "host": socket.gethostname(), "boot_id": boot_id(), "started_at": now(), "ended_at": None,
        "exit_code": None, "detached": request.detach,
        "launcher_pid": os.getpid(),  # a `starting` run whose launcher and supervisor are gone is lost
    }
    write_json_atomic(run_dir / RUN_JSON, record)
    try:
        cache_dir, fingerprint = _preflight_cache(venv, request, phases, described, config_path)
        update_run(run_dir, env_key=cache_dir.name, cache_dir=str(cache_dir), cache_fingerprint=fingerprint,
                preflight_s=phases.timings)
        if request.detach:
            return _detach(run_dir, phases)
        phases.say(f"[5/5] train: {run_dir} (log: {run_dir / LOG})")
        return supervise(run_dir, echo=not quiet) | {"run_dir": str(run_dir)}
    except BaseException as exc:
        # Interrupted or failed before the supervisor recorded anything: run.json must still say so.
        if read_run(run_dir).get("status") == "starting":
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            update_run(run_dir, status=status, ended_at=now(), error=str(exc) or type(exc).__name__)
        raise


# Trainer flags that envkit sets itself: given after `--` they would send outputs or config elsewhere while
# run.json records this run dir.
RESERVED_TRAINER_FLAGS = {"--out": "the run dir is envkit's (--name, --runs-dir)",
                          "--config": "give `envkit train --config FILE`", "--preset": "give `envkit train --preset NAME`"}


def _check_trainer_args(args: tuple[str, ...]) -> None:
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_TRAINER_FLAGS:
            raise RunError(f"`-- {flag}` is set by envkit itself ({RESERVED_TRAINER_FLAGS[flag]}); nothing was started")


def tmux_session_name(run_name: str) -> str:
    """tmux turns '.' and ':' into '_' in session names; a name that survives as given can be used to stop it."""
    base = "envkit-" + re.sub(r"[^A-Za-z0-9_-]", "_", run_name)
    name, suffix = base, 1
    while subprocess.run(["tmux", "has-session", "-t", f"={name}"], capture_output=True).returncode == 0:
        suffix += 1
        name = f"{base}-{suffix}"
    return name


def _detach(run_dir: Path, phases: Phases) -> dict:
    """Start the supervisor in tmux (or a new session); it records its own pid and status in run.json."""
    supervisor = [sys.executable, "-m", "envkit", "supervise", str(run_dir)]
    follow = f"envkit logs {run_dir.name} -f"
    if shutil.which("tmux"):
        session = tmux_session_name(run_dir.name)
        # Written before the start, so that run.json has a single writer once the supervisor runs.
        update_run(run_dir, tmux_session=session)
        started = subprocess.run(["tmux", "new-session", "-d", "-s", session, shlex.join(supervisor)],
                                 capture_output=True, text=True)
        if started.returncode != 0:
            raise RunError(f"tmux could not start session {session}: {started.stderr.strip()}; run without --detach "
                           f"or fix tmux")
        where, follow, stop = f"tmux session {session}", f"tmux attach -t {session}  or  {follow}", \
            f"tmux send-keys -t {session} C-c"
    else:
        with open(os.devnull, "rb") as stdin, open(os.devnull, "wb") as devnull:
            proc = subprocess.Popen(supervisor, stdin=stdin, stdout=devnull, stderr=devnull, start_new_session=True)
        where, stop = f"a new session (pid {proc.pid}; tmux is not installed)", f"kill -TERM {proc.pid}"
    _wait_until_supervised(run_dir)
    phases.say(f"[5/5] train: detached in {where}\n  follow: {follow}\n  stop:   {stop}")
    return read_run(run_dir) | {"run_dir": str(run_dir)}


def _wait_until_supervised(run_dir: Path, timeout: float = 30.0) -> None:
    """Return once the supervisor has taken the run over, so `starting` never outlives this process unnoticed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_run(run_dir).get("status") != "starting":
            return
        time.sleep(0.1)
    raise RunError(f"the detached supervisor did not start within {timeout:.0f}s; see {run_dir / LOG}")


def supervise(run_dir: Path, *, echo: bool) -> dict:
    """Run the recorded command, tee its output to train.log, forward signals, record the end."""
    record = read_run(run_dir)
    venv = Venv(Path(record["venv"]))
    env = trainer_env(venv, Path(record["cache_dir"]))
    with (run_dir / LOG).open("ab") as log:
        # A session of its own: signals reach it only through us, once. It dies with us (SIGTERM, so it
        # checkpoints) rather than run on unsupervised.
        proc = subprocess.Popen(record["command"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)
        update_run(run_dir, status="running", pid=proc.pid, supervisor_pid=os.getpid())

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
    if status == "failed":
        fields["error"] = worker_failure(run_dir / LOG) or f"the trainer exited {code}; see {run_dir / LOG}"
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
