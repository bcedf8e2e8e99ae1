"""`envkit lock` and `envkit create`: lock profiles and the venvs built from them."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from envkit.cli.app import as_dict, main, print_json
from envkit.cli.options import check_profile_choice, lock_option, profile_option, with_sources


@main.command("lock")
@profile_option
@lock_option
@with_sources
@click.option("--check", is_flag=True, help="Exit 1 if the file is out of date; write nothing.")
@click.option("--export", "export_format", type=click.Choice(["pylock"]), help="Export instead of re-locking.")
@click.argument("export_path", required=False, type=click.Path(dir_okay=False))
@click.option("--from-venv", "from_venv", type=click.Path(file_okay=False, exists=True), metavar="PATH",
              help="Write a new profile (--profile NAME or --lock FILE) pinned to what this venv holds.")
@click.option("--keep-strays", is_flag=True, help="With --from-venv: keep packages the stray catalog flags.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def lock_command(profile_name, lock_path, find_links, offline, no_index, check, export_format, export_path,
                 from_venv, keep_strays, as_json):
    """Regenerate a profile's hash-pinned [[package]] table from its requirements.

    With --export pylock PATH, write the locked set as a PEP 751 pylock.toml instead. With
    --from-venv PATH, adopt an existing venv: a new profile pinned to its packages (strays left out
    and listed), resolved and hashed, so that `envkit create --profile NAME` reproduces it.
    """
    from envkit.lock import resolve as lock

    check_profile_choice(profile_name, lock_path)
    if from_venv:
        from envkit.doctor.adopt import adopt

        result = adopt(from_venv, profile_name, lock_path, keep_strays=keep_strays, find_links=find_links,
                       offline=offline, no_index=no_index)
        if as_json:
            return print_json(as_dict(result))
        for name, why in sorted(result.left_out.items()):
            click.echo(f"left out {name}: {why} (--keep-strays keeps it)")
        click.echo(f"wrote {result.path}: {result.packages} packages pinned to {from_venv}")
        return
    if export_format:
        if not export_path:
            raise click.UsageError("--export pylock needs a PATH to write")
        written = lock.export_pylock(profile_name, lock_path, Path(export_path), find_links=find_links,
                                     offline=offline, no_index=no_index)
        return print_json({"exported": str(written)}) if as_json else click.echo(f"wrote {written}")
    if export_path:
        raise click.UsageError(f"unexpected argument {export_path!r} (only --export takes a path)")
    result = lock.lock(profile_name, lock_path, find_links=find_links, offline=offline, no_index=no_index, check=check)
    if as_json:
        print_json(as_dict(result))
    else:
        for line in [*(f"+ {n}" for n in result.added), *(f"- {n}" for n in result.removed),
                     *(f"~ {n}" for n in result.updated)]:
            click.echo(line)
        state = "out of date" if check and result.changed else ("updated" if result.changed else "up to date")
        click.echo(f"{result.path}: {result.packages} packages, {state}")
    if check and result.changed:
        sys.exit(1)


@main.command("create")
@profile_option
@lock_option
@click.option("--venv", "venv_path", type=click.Path(file_okay=False), metavar="PATH",
              help="Where the venv goes (default: $ENVKIT_HOME/venvs/<profile>).")
@with_sources
@click.option("--force", is_flag=True, help="Rebuild even if the venv matches the lock (only venvs envkit made are ever replaced).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def create_command(profile_name, lock_path, venv_path, find_links, offline, no_index, force, as_json):
    """Build a fresh venv from a hash-pinned lock profile, atomically.

    The venv is built in a temporary sibling directory and renamed into place only when it is
    complete: a failure or Ctrl-C leaves the previous venv as it was.
    """
    from envkit.venv.create import create

    check_profile_choice(profile_name, lock_path)
    result = create(profile_name, lock_path, venv_path, find_links=find_links, offline=offline,
                    no_index=no_index, force=force, quiet=as_json)
    if as_json:
        print_json(as_dict(result))
    else:
        click.echo(f"{result.action}: {result.venv} (profile {result.profile}, lock {result.lock_digest[:12]}, "
                   f"{result.packages} packages, {result.seconds:.1f}s)")
