"""`envkit doctor` and `envkit selftest`: how a venv differs from its lock, and the hazards proven."""

from __future__ import annotations

import sys

import click

from envkit.cli.app import main, print_json
from envkit.cli.options import (check_profile_choice, lock_option, profile_option, training_venv_from_options,
                                venv_option, with_sources)


@main.command("doctor")
@click.option("--venv", "venv_path", type=click.Path(file_okay=False), metavar="PATH",
              help="The venv to examine (default: the profile's managed venv).")
@profile_option
@lock_option
@click.option("--json", "as_json", is_flag=True, help='Print {"venv", "profile", "findings", "summary"}.')
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--deep", is_flag=True, help="Hash every installed file, binaries included (slower).")
@click.option("--fix", "apply_fix", is_flag=True, help="Re-sync the venv to its lock, then check again.")
@click.option("-v", "--verbose", is_flag=True, help="List every finding under its cause (and the ok ones).")
@click.option("--history", "show_history", is_flag=True,
              help="What was installed, replaced or removed since envkit made the venv, oldest first, with the installer "
                   "(hand edits of files are in the report itself, with their diff).")
@click.option("--fetch", is_flag=True,
              help="Download the wheel of an edited package (exactly its version) to show the edit as a diff.")
@with_sources
def doctor_command(venv_path, profile_name, lock_path, as_json, strict, deep, apply_fix, verbose, show_history,
                   fetch, find_links, offline, no_index):
    """Tell exactly how a venv differs from its lock, and what in it is dangerous.

    Reads the venv from outside: metadata, RECORD hashes, .pth files, pyvenv.cfg, torch's own
    source. Exit 0 when nothing fails, 1 when something fails (--strict: or warns), 2 on usage
    errors. The lock comes from the venv's envkit.json unless --profile/--lock is given.
    """
    from envkit import doctor
    from envkit.doctor import render

    check_profile_choice(profile_name, lock_path)
    ctx = doctor.load_context(venv_path, profile_name, lock_path, deep=deep, fetch=fetch, find_links=find_links)
    report = doctor.diagnose(ctx)
    if apply_fix:
        before = report
        doctor.fix(ctx, find_links=find_links, offline=offline, no_index=no_index)
        report = doctor.diagnose(doctor.load_context(venv_path, profile_name, lock_path, deep=deep))
        if not as_json:
            click.echo(f"before --fix: {before.summary['fail']} fail, {before.summary['warn']} warn; "
                       f"after: {report.summary['fail']} fail, {report.summary['warn']} warn", err=True)
    if as_json:
        click.echo(render.as_json(report))
    elif show_history:
        click.echo(render.as_history(report))
    else:
        click.echo(render.as_story(report, colour=sys.stdout.isatty(), verbose=verbose))
    sys.exit(1 if report.failed(strict=strict) else 0)


@main.command("selftest")
@venv_option
@profile_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def selftest_command(venv_path, profile_name, as_json):
    """Prove the trainer's torch hazard mitigations in a venv, and record the result for doctor.

    Each self-test reproduces its hazard (HAZARDS.md) with the mitigation off and shows it gone
    with the mitigation on, in the venv's own torch, with the environment training runs in.
    `warm-cache` runs them too. Exit 1 when one fails.
    """
    from envkit.cache import warmup
    from envkit.trainerproc.hazard_proof import render

    venv = training_venv_from_options(venv_path, profile_name, "selftest")
    record = warmup.run_selftests(venv)
    if as_json:
        print_json(record)
    else:
        click.echo(f"hazard self-tests in {venv.path} (torch {record['torch']}, trainer {record['trainer']}):")
        click.echo(render(record))
    sys.exit(0 if all(r.get("passed") for r in record["results"].values()) else 1)
