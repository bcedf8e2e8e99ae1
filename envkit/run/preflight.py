"""Preflight shared by `envkit train` and `envkit run`: the venv, doctor, the compile cache, the self-tests."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from envkit import __version__, doctor, paths
from envkit.trainerproc import hazard_proof as selftest
from envkit.venv import record as venvrecord
from envkit.cache import warmup
from envkit.trainerproc import cacheenv
from envkit.cache.fingerprint import read_fingerprint, tampered_names
from envkit.cache.key import compile_root, ensure_private_dir, env_key, key_parts
from envkit.venv.create import create
from envkit.doctor.findings import Report, Status
from envkit.doctor.render import as_table
from envkit.errors import RunError
from envkit.venv.installed import installed_versions
from envkit.lock import profile as profiles
from envkit.lock.uvtool import uv_version
from envkit.run.rundir import check_run_name
from envkit.support.progress import Phases
from envkit.support.text import printable
from envkit.trainerproc.source import trainer_digest
from envkit.venv.managed import Venv

# Warnings that `envkit train` itself resolves: it warms a cold cache and runs the hazard self-tests that
# have not run in this venv yet (a failed self-test is a fail finding, which stops the run).
HANDLED_WARNINGS = {"cache.fingerprint", "torch.hazard"}


def git_commit(directory: Path = paths.PROJECT_ROOT) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions(venv: Venv) -> dict:
    installed = installed_versions(venv.site_packages())
    return {"envkit": __version__, "python": venv.python_version(), "uv": uv_version(),
            **{name: installed.get(name) for name in ("torch", "transformers", "triton")}}


def _blocking(report: Report, allow_warn: bool) -> list:
    """Findings that stop a run: every fail, and warnings train does not handle unless --allow-warn."""
    return [f for f in report.findings if f.status == Status.FAIL
            or (f.status == Status.WARN and not allow_warn and f.id not in HANDLED_WARNINGS)]


ROLE_ADVICE = {
    "train": "train in a training venv: `envkit create --profile cpu --venv .venv-train` (cuda on a GPU host) and "
             "pass that --venv",
    "serve": "serving engines run from a venv of their own, so training's torch stays its own: `envkit create "
             "--profile serve-cpu --venv .venv-serve` (serve-vllm or serve-sglang on a CUDA host) and pass that --venv",
}


def require_role(venv: Venv, profile: profiles.Profile | None, wanted: str) -> venvrecord.Role:
    """The venv's role is `wanted`, or one line saying what it is and what to use instead. An existing venv's role
    is venvrecord.role_for's, the one every command uses; one not made yet has the role of its profile."""
    role = venvrecord.role_for(venv, profile.name if profile else None) if venv.path.exists() \
        else venvrecord.role_of(venv, profile)
    if role.name != wanted:
        made = f"created from profile {role.profile}" if role.recorded else f"profile {role.profile}"
        what = {"serve": "a serve venv", "train": "a training venv"}[role.name]
        raise RunError(f"{printable(venv.path)} is {what} ({made}); {ROLE_ADVICE[wanted]}")
    return role


def preflight_venv(venv_path: str | None, profile_name: str | None, phases: Phases, role: str = "train") -> Venv:
    """The venv to run in (created from the profile when it does not exist yet), of the role the command needs."""
    named = profiles.load(profile_name) if profile_name else None
    profile_name = profile_name or paths.DEFAULT_PROFILE
    path = Path(venv_path) if venv_path else paths.default_venv(profile_name)
    venv = Venv(path.expanduser().absolute())
    if not venv.path.exists():
        require_role(venv, named, role)  # before a venv of the wrong kind is made
        with phases.phase("create", f"{venv.path} from profile {profile_name}"):
            create(profile_name, None, venv.path)
    else:
        with phases.phase("create", f"{venv.path} exists"):
            venv.require()
    require_role(venv, named, role)
    return venv


def preflight_doctor(venv: Venv, profile_name: str | None, allow_warn: bool, phases: Phases):
    with phases.phase("doctor"):
        ctx = doctor.load_context(venv.path, profile_name or None)
        report = doctor.diagnose(ctx)
    blocking = _blocking(report, allow_warn)
    if blocking:
        shown = Report(report.venv, report.profile, tuple(blocking), report.skipped)
        raise RunError("doctor found problems; nothing was started:\n" + as_table(shown, colour=False, show_ok=False)
                       + ("\n(warnings only? --allow-warn starts anyway)" if all(f.status == Status.WARN
                                                                                  for f in blocking) else ""))
    return ctx.profile


def preflight_cache(venv: Venv, phases: Phases, described: dict, config_path: Path, *, no_warm: bool,
                    layout: tuple[str, ...]) -> tuple[Path, str | None]:
    if not described["config"].get("compile"):
        # Nothing is compiled, so nothing to warm or verify; the private dir still keeps torch out of /tmp.
        cache_dir = compile_root() / env_key(key_parts(venv, None, str(config_path), described))
        ensure_private_dir(cache_dir)
        prove_mitigations(venv, cache_dir, described["torch"], phases)
        return cache_dir, None
    with phases.phase("cache", "verify"):
        result = warmup.verify(venv, None, str(config_path), described)
    if result.tampered:
        raise RunError(f"the compile cache {result.cache_dir} changed since it was fingerprinted or holds entries no "
                       f"fingerprint can vouch for ({tampered_names(result)}); remove it and run `envkit warm-cache`")
    if not result.fingerprinted:
        if no_warm:
            raise RunError(f"the compile cache for this run's config is cold (env key {result.env_key}); run "
                           f"`envkit warm-cache --venv {shlex.quote(str(venv.path))} --config {shlex.quote(str(config_path))}` first, or drop --no-warm")
        with phases.phase("warm-cache", f"cold env key {result.env_key}"):
            warmup.warm(venv, None, str(config_path), described=described, quiet=not sys.stderr.isatty(),
                       layout=warmup.layout_args(layout))
    prove_mitigations(venv, Path(result.cache_dir), described["torch"], phases)
    fingerprint = read_fingerprint(Path(result.cache_dir))
    return Path(result.cache_dir), fingerprint["digest"]


def prove_mitigations(venv: Venv, cache_dir: Path, torch_version: str, phases: Phases) -> None:
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


def note_cache_overrides(cache_dir: Path, phases: Phases) -> list[str]:
    """Name the caller's cache variables the run replaces (envkit/trainerproc/cacheenv.py); returned for run.json."""
    names = cacheenv.overridden(os.environ, cache_dir)
    note = cacheenv.override_note(names)
    if note:
        phases.say(note)
    return names


def new_run_dir(name: str | None, runs_dir: str | None, what: str) -> Path:
    """runs/<name> (default: UTC time and `what`), refused when it exists."""
    name = check_run_name(name or f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{what}")
    root = Path(runs_dir) if runs_dir else paths.runs_dir()
    run_dir = root / name
    if run_dir.exists() or run_dir.is_symlink():
        raise RunError(f"run dir {run_dir} already exists; choose another --name")
    return run_dir


