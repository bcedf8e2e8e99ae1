"""`envkit doctor`: how a venv differs from its lock, and what in it is dangerous for training; `lock --from-venv`
(adopt). May import: cache, trainerproc, venv (its --fix re-syncs with venv.create), lock, support, errors, paths."""

from __future__ import annotations

import dataclasses
import os
import shutil

from envkit.venv import record as venvrecord
from envkit.doctor import cachechecks, environment, files, packages, startup, story, torchchecks
from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Report, Status
from envkit.errors import ProfileError
from envkit.lock.uvtool import run_uv
from envkit.venv.managed import resolve_venv

__all__ = ["Finding", "Report", "Status", "diagnose", "fix", "load_context"]

# (check, needs a lock): the order of the report.
CHECKS = (
    (packages.check_lock, True),
    (packages.check_strays, False),
    (packages.check_invalid, False),
    (packages.check_duplicates, False),
    (packages.check_requires, False),
    (files.check_modified, False),
    (files.check_pth, False),
    (startup.check_startup, False),
    (startup.check_site_packages, False),
    (startup.check_interpreter, False),
    (environment.check_env, False),
    (torchchecks.check_build, False),
    (cachechecks.check_perms, False),
    (cachechecks.check_fingerprint, False),
    (torchchecks.check_hazards, False),
)
# What only a training venv has: the trainer's compile cache and its threads' torch hazards. A serve venv is
# checked for everything else (drift, edits, start-up code, duplicates, variables) as a training venv is.
TRAINING_ONLY = {cachechecks.check_perms, cachechecks.check_fingerprint, torchchecks.check_hazards}


def load_context(venv_path=None, profile_name=None, lock_path=None, *, deep=False, environ=None, fetch=False,
                 find_links=()) -> Context:
    venv = resolve_venv(venv_path, profile_name)
    choice = venvrecord.lock_for(venv, profile_name, lock_path)
    return Context(venv, choice.profile, dict(os.environ if environ is None else environ),
                   deep=deep, fetch=fetch, find_links=tuple(find_links), lock_refused=choice.refused,
                   role=venvrecord.role_of(venv, choice.profile).name)  # = venvrecord.role_for


def diagnose(ctx: Context) -> Report:
    findings: list[Finding] = []
    skipped = []
    for check, needs_lock in CHECKS:
        if ctx.role == "serve" and check in TRAINING_ONLY:
            continue
        if needs_lock and ctx.lock_refused:
            findings.append(Finding("lock.untrusted", Status.FAIL, str(ctx.venv.path),
                                    f"no lock checked: {ctx.lock_refused}", ctx.lock_fix_command()))
            continue
        if needs_lock and ctx.profile is None:
            skipped.append("lock.missing/lock.version/lock.extra: no lock (give --profile NAME or --lock PATH)")
            continue
        findings += check(ctx)
    if ctx.role == "serve":
        skipped.append("cache.perms/cache.fingerprint/torch.hazard: a serve venv (it compiles nothing of the trainer's)")
    report = Report(str(ctx.venv.path), ctx.profile.name if ctx.profile else None, tuple(findings), tuple(skipped))
    events = story.history(ctx)
    return dataclasses.replace(report, causes=tuple(story.causes(ctx, report, events)), history=tuple(events))


def fix(ctx: Context, *, find_links=(), offline=False, no_index=False) -> None:
    """Re-sync the venv to its lock in place: strays, duplicates, drift and edited files go."""
    # Only --fix installs: uv, the lock and the wheelhouse stay out of every plain doctor's start-up.
    from envkit.lock import wheelhouse
    from envkit.venv.create import sync

    if ctx.profile is None:
        raise ProfileError("--fix needs a lock: give --profile NAME or --lock PATH")
    duplicated = [dists for dists in ctx.by_name.values() if len(dists) > 1]
    edited = {name for name, _relative, _missing, _digest in files.modified_files(ctx)}
    # Two dist-info folders confuse any installer: drop both; the sync then installs the locked one.
    for dists in duplicated:
        for dist in dists:
            shutil.rmtree(dist.dist_info, ignore_errors=True)
            ctx.forget(dist)  # gone: it owns no .pth any more
    # A .pth that no package installed is not part of any lock.
    owners = files.pth_owners(ctx)
    for pth in ctx.site_packages.glob("*.pth"):
        if pth.name not in files.STANDARD_PTH and pth.name not in owners:
            pth.unlink()
    reinstall = sorted(edited & {p.name for p in ctx.profile.packages})
    if reinstall:
        # uv installs by hard-linking from its cache, so an in-place edit also edited the cached
        # copy: drop those cache entries, or the reinstall would link the edited file again.
        run_uv(["cache", "clean", *reinstall, "--quiet"])
    # uv keeps a package whose version matches; reinstall the ones with edited files.
    sync(ctx.venv, ctx.profile, wheelhouse.find_links(find_links), offline=offline, no_index=no_index,
         reinstall=reinstall)
