"""`envkit warm-cache` and `envkit cache export|import|ls|prune`: the compile cache."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from envkit.cli.app import as_dict, main, print_json
from envkit.cli.options import (check_preset_choice, config_option, preset_option, profile_option,
                                training_venv_from_options, venv_option)
from envkit.support.text import printable


@main.command("warm-cache", context_settings={"ignore_unknown_options": True})
@venv_option
@profile_option
@preset_option
@config_option
@click.option("--verify", "only_verify", is_flag=True, help="Re-hash the cache and compare with its fingerprint.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("layout", nargs=-1, type=click.UNPROCESSED)
def warm_cache_command(venv_path, profile_name, preset, config_path, only_verify, as_json, layout):
    """Compile every shape bucket once into a private cache, then fingerprint it.

    Runs the trainer's warm-up single-threaded in the venv's interpreter, forward and backward,
    with TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR in $ENVKIT_CACHE_DIR/compile/<env-key> (0700),
    holding a file lock. --verify reports removed or changed files (exit 1) apart from added ones.
    A threaded layout over several devices warms each of them: `-- --targets cuda:0,cuda:1 --drafters cuda:2`.
    Processes under torchrun each see only their own GPU as cuda:0, so one warm-up serves every rank.
    """
    from envkit.cache import warmup

    check_preset_choice(preset, config_path)
    venv = training_venv_from_options(venv_path, profile_name, "warm-cache")
    if only_verify:
        result = warmup.verify(venv, preset, config_path)
        if as_json:
            print_json({**as_dict(result), "ok": result.ok})
        else:
            click.echo(render_verification(result))
        sys.exit(0 if result.ok else 1)
    extra = [arg for arg in layout if arg not in warmup.layout_args(layout)]
    if extra:
        raise click.UsageError(f"after `--` warm-cache takes only --targets, --drafters and --device, not {extra[0]}")
    result = warmup.warm(venv, preset, config_path, quiet=as_json, layout=layout)
    if as_json:
        print_json(as_dict(result))
    else:
        click.echo(f"warm: {result.cache_dir} ({len(result.buckets)} buckets {result.buckets}, {result.files} files, "
                   f"{result.bytes / 1e6:.1f} MB, {result.seconds:.1f}s)")
        click.echo("counters: " + ", ".join(f"{k} {v}" for k, v in sorted(result.counters.items())))
        click.echo(f"fingerprint: {result.fingerprint[:16]}")
        failed = sorted(h for h, passed in result.selftests.items() if not passed)
        click.echo(f"hazard self-tests: {len(result.selftests) - len(failed)} of {len(result.selftests)} passed"
                   + (f"; FAILED: {', '.join(failed)} (`envkit selftest` shows why)" if failed else ""))


def render_verification(result) -> str:
    if not result.fingerprinted:
        why = "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in result.key_differs.items())
        return (f"cold: no fingerprinted cache for env key {result.env_key}"
                + (f" (this venv's last cache differs in {why})" if why else "") + "; run `envkit warm-cache`")
    lines = [f"changed: {p}" for p in result.changed] + [f"removed: {p}" for p in result.removed]
    lines += [f"untrusted: {p}: {why}" for p, why in result.untrusted.items()]
    lines += [f"added (growth): {p}" for p in result.added]
    verdict = "ok" if result.ok else "FAILED: the cache changed since it was fingerprinted; remove it and warm again"
    return "\n".join(lines + [f"{result.cache_dir}: {verdict}"])


@main.group("cache")
def cache_group():
    """Move, list and prune compile caches."""


@cache_group.command("export")
@click.argument("file", type=click.Path(dir_okay=False))
@venv_option
@profile_option
@preset_option
@config_option
@click.option("--json", "as_json", is_flag=True)
def cache_export_command(file, venv_path, profile_name, preset, config_path, as_json):
    """Write the warm cache as one portable file (torch's Mega-Cache plus the env key)."""
    from envkit.cache import port as cacheport

    check_preset_choice(preset, config_path)
    result = cacheport.export(training_venv_from_options(venv_path, profile_name, "cache export"), Path(file), preset, config_path, quiet=as_json)
    if as_json:
        return print_json(result)
    click.echo(f"exported {result['file']} ({result['bytes'] / 1e6:.1f} MB, {result['artifacts']} artifacts, "
               f"env key {result['env_key']})")
    click.echo(f"sha256 {result['sha256']}")
    click.echo(f"  import elsewhere: envkit cache import {Path(file).name} --sha256 {result['sha256']}")


@cache_group.command("import")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@venv_option
@profile_option
@click.option("--sha256", "pinned", metavar="HEX",
              help="The export's sha256, as `envkit cache export` printed it where it was made (required).")
@click.option("--json", "as_json", is_flag=True)
def cache_import_command(file, venv_path, profile_name, pinned, as_json):
    """Load an exported cache into this machine's cache root.

    An export is code from whoever made it: it is accepted only when its sha256 equals --sha256,
    then every artifact is checked against the export's digests, kinds and keys before torch reads
    it. Refuses another env key.
    """
    from envkit.cache import port as cacheport

    result = cacheport.import_(training_venv_from_options(venv_path, profile_name, "cache import"), Path(file), sha256=pinned)
    print_json(result) if as_json else click.echo(f"imported into {result['cache_dir']} ({result['artifacts']} "
                                                   f"artifacts, {result['files']} files, {result['seconds']:.1f}s)")


@cache_group.command("ls")
@click.option("--json", "as_json", is_flag=True)
def cache_ls_command(as_json):
    """List compile caches with their preset, venv and size."""
    from envkit.cache import store

    rows = store.list_caches()
    if as_json:
        return print_json(rows)
    for row in rows:
        state = "corrupted" if row["corrupted"] else ("fingerprinted" if row["fingerprinted"] else "not fingerprinted")
        click.echo(f"{row['env_key']}  {row['bytes'] / 1e6:8.1f} MB  {row['preset'] or '-':9} {state:17} {row['venv'] or '-'}")
    if not rows:
        click.echo("no compile caches")


@cache_group.command("prune")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@click.option("--json", "as_json", is_flag=True)
def cache_prune_command(dry_run, as_json):
    """Remove caches of env keys no venv uses any more."""
    from envkit.cache import store

    removed = store.prune(dry_run=dry_run)
    if as_json:
        return print_json(removed)
    for row in removed:
        click.echo(printable(f"{'would remove' if dry_run else 'removed'} {row['path']}: {row['reason']}"))
    click.echo(f"{len(removed)} caches {'to prune' if dry_run else 'pruned'}")
