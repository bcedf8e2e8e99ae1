"""Command line: parse, call one library function, render, map errors to exit codes."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import click

from envkit import __version__
from envkit.errors import EnvkitError
from envkit.text import printable


def _print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _as_dict(result) -> dict:
    return dataclasses.asdict(result) if dataclasses.is_dataclass(result) else dict(result)


class EnvkitGroup(click.Group):
    """Turns EnvkitError into `Error: ...` on stderr and exit 1; other exceptions keep their traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EnvkitError as exc:
            # Messages quote what envkit read (a trainer's stderr, a file name): no byte of it may steer the terminal.
            click.echo(f"Error: {printable(exc, keep_newlines=True)}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)


profile_option = click.option("--profile", "profile_name", metavar="NAME",
                              help="Lock profile from lockfiles/ (default: cpu).")
lock_option = click.option("--lock", "lock_path", type=click.Path(dir_okay=False), metavar="PATH",
                           help="Lock profile file, instead of --profile.")
source_options = [
    click.option("--find-links", multiple=True, metavar="DIR",
                 help="Wheelhouse to install from (repeatable); also ENVKIT_FIND_LINKS, UV_FIND_LINKS and pip's "
                      "find-links configuration."),
    click.option("--offline", is_flag=True, help="Use only uv's cache and wheelhouses; no network."),
    click.option("--no-index", is_flag=True, help="Ignore the package index; install from wheelhouses only."),
]


def _all(options):
    """One decorator applying click options in the order listed."""
    def apply(func):
        for option in reversed(options):
            func = option(func)
        return func
    return apply


with_sources = _all(source_options)


def run_dir_options(default_name: str):
    """--name, --runs-dir and --detach: where a run (train's or run's) goes and whether it detaches."""
    return _all([
        click.option("--name", metavar="NAME", help=f"Run name (default: {default_name})."),
        click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR",
                     help="Where run directories go (default: ./runs or $ENVKIT_RUNS_DIR)."),
        click.option("--detach", is_flag=True,
                     help="Run in a tmux session (or a new session without tmux) and return."),
    ])


rdzv_port_option = click.option("--rdzv-port", type=click.IntRange(1, 65535), metavar="PORT",
                                help="Under Slurm: the rendezvous port on the first node (default 29500).")


def _check_profile_choice(profile_name, lock_path) -> None:
    if profile_name and lock_path:
        raise click.UsageError("give --profile or --lock, not both")


@click.group(cls=EnvkitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="envkit")
def main():
    """Reproducible GPU training environments with a trusted compile cache.

    \b
    envkit create      fresh venv from a hashed lock profile (uv), atomically
    envkit doctor      how a venv differs from its lock, and what is dangerous in it
    envkit warm-cache  compile every shape bucket once, then fingerprint the cache
    envkit train       preflight, then run the bundled DFlash trainer with a run dir
    envkit export      a run's drafter in the DFlash format SGLang, vLLM and dflash serve
    """


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
    from envkit import lock

    _check_profile_choice(profile_name, lock_path)
    if from_venv:
        from envkit.adopt import adopt

        result = adopt(from_venv, profile_name, lock_path, keep_strays=keep_strays, find_links=find_links,
                       offline=offline, no_index=no_index)
        if as_json:
            return _print_json(_as_dict(result))
        for name, why in sorted(result.left_out.items()):
            click.echo(f"left out {name}: {why} (--keep-strays keeps it)")
        click.echo(f"wrote {result.path}: {result.packages} packages pinned to {from_venv}")
        return
    if export_format:
        if not export_path:
            raise click.UsageError("--export pylock needs a PATH to write")
        written = lock.export_pylock(profile_name, lock_path, Path(export_path), find_links=find_links,
                                     offline=offline, no_index=no_index)
        return _print_json({"exported": str(written)}) if as_json else click.echo(f"wrote {written}")
    if export_path:
        raise click.UsageError(f"unexpected argument {export_path!r} (only --export takes a path)")
    result = lock.lock(profile_name, lock_path, find_links=find_links, offline=offline, no_index=no_index, check=check)
    if as_json:
        _print_json(_as_dict(result))
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
    from envkit.create import create

    _check_profile_choice(profile_name, lock_path)
    result = create(profile_name, lock_path, venv_path, find_links=find_links, offline=offline,
                    no_index=no_index, force=force, quiet=as_json)
    if as_json:
        _print_json(_as_dict(result))
    else:
        click.echo(f"{result.action}: {result.venv} (profile {result.profile}, lock {result.lock_digest[:12]}, "
                   f"{result.packages} packages, {result.seconds:.1f}s)")


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

    _check_profile_choice(profile_name, lock_path)
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


venv_option = click.option("--venv", "venv_path", type=click.Path(file_okay=False), metavar="PATH",
                           help="The managed venv (default: the profile's, $ENVKIT_HOME/venvs/<profile>).")
preset_option = click.option("--preset", default=None, metavar="NAME", help="Trainer preset: tiny (default), qwen3_8b.")
config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True), metavar="PATH",
                             help="A JSON trainer config instead of a preset.")


def _venv(venv_path, profile_name):
    from envkit.venv import resolve_venv

    return resolve_venv(venv_path, profile_name)  # a VenvError: `Error: ...`, exit 1


def _check_preset_choice(preset, config_path) -> None:
    if preset and config_path:
        raise click.UsageError("give --preset or --config, not both")


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

    _check_preset_choice(preset, config_path)
    venv = _venv(venv_path, profile_name)
    if only_verify:
        result = warmup.verify(venv, preset, config_path)
        if as_json:
            _print_json({**_as_dict(result), "ok": result.ok})
        else:
            click.echo(render_verification(result))
        sys.exit(0 if result.ok else 1)
    extra = [arg for arg in layout if arg not in warmup.layout_args(layout)]
    if extra:
        raise click.UsageError(f"after `--` warm-cache takes only --targets, --drafters and --device, not {extra[0]}")
    result = warmup.warm(venv, preset, config_path, quiet=as_json, layout=layout)
    if as_json:
        _print_json(_as_dict(result))
    else:
        click.echo(f"warm: {result.cache_dir} ({len(result.buckets)} buckets {result.buckets}, {result.files} files, "
                   f"{result.bytes / 1e6:.1f} MB, {result.seconds:.1f}s)")
        click.echo("counters: " + ", ".join(f"{k} {v}" for k, v in sorted(result.counters.items())))
        click.echo(f"fingerprint: {result.fingerprint[:16]}")
        failed = sorted(h for h, passed in result.selftests.items() if not passed)
        click.echo(f"hazard self-tests: {len(result.selftests) - len(failed)} of {len(result.selftests)} passed"
                   + (f"; FAILED: {', '.join(failed)} (`envkit selftest` shows why)" if failed else ""))


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
    from envkit.selftest import render

    venv = _venv(venv_path, profile_name)
    record = warmup.run_selftests(venv)
    if as_json:
        _print_json(record)
    else:
        click.echo(f"hazard self-tests in {venv.path} (torch {record['torch']}, trainer {record['trainer']}):")
        click.echo(render(record))
    sys.exit(0 if all(r.get("passed") for r in record["results"].values()) else 1)


@main.group("data")
def data_group():
    """Data files prepared once into token stores that every run and rank memory-maps."""


@data_group.command("prepare")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False, exists=True), metavar="PATH",
              help="JSONL (input_ids/loss_mask, text, conversations) or a plain text file.")
@venv_option
@profile_option
@click.option("--preset", metavar="NAME", help="The run's preset (its target decides the tokenizer and vocabulary).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True), metavar="FILE",
              help="The run's JSON config instead of --preset.")
@click.option("--tokenizer", metavar="DIR", help="Tokenizer for text and conversations (default: the target's).")
@click.option("--chat-template-kwargs", metavar="JSON", help='E.g. \'{"enable_thinking": false}\'.')
@click.option("--skip-bad", is_flag=True, help="Count and skip malformed lines instead of stopping at the first.")
@click.option("--verify", is_flag=True, help="Re-hash every file of the store against its manifest.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def data_prepare_command(data_path, venv_path, profile_name, preset, config_path, tokenizer, chat_template_kwargs,
                         skip_bad, verify, as_json):
    """Tokenize a data file once into $ENVKIT_HOME/data/KEY (memory-mapped token arrays and a manifest).

    KEY is a digest of the file's bytes, the tokenizer's files, the template kwargs and the data code:
    `envkit train -- --data PATH` with the same inputs reuses it, a changed input is a new store.
    Runs in worker processes on every core, with progress; a bad line names FILE:LINE.
    """
    from envkit.dataprep import prepare

    _check_preset_choice(preset, config_path)
    venv = _venv(venv_path, profile_name)
    args = ["--data", str(Path(data_path).absolute()),
            *(["--config", str(Path(config_path).absolute())] if config_path else ["--preset", preset or "tiny"]),
            *(["--tokenizer", tokenizer] if tokenizer else []),
            *(["--chat-template-kwargs", chat_template_kwargs] if chat_template_kwargs else []),
            *(["--skip-bad"] if skip_bad else []), *(["--verify"] if verify else [])]
    result = prepare(venv, args)
    if as_json:
        return _print_json(result)
    how = "reused" if result["reused"] else f"prepared in {result['seconds']}s ({result['rows_per_s']:,.0f} rows/s)"
    click.echo(printable(f"{result['store']}: {result['rows']:,} rows, {result['tokens']:,} tokens, "
                         f"{result['skipped']} malformed lines skipped; {how}"
                         + ("; every file re-hashed and intact" if result.get("verified") else "")))


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

    _check_preset_choice(preset, config_path)
    result = cacheport.export(_venv(venv_path, profile_name), Path(file), preset, config_path, quiet=as_json)
    if as_json:
        return _print_json(result)
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

    result = cacheport.import_(_venv(venv_path, profile_name), Path(file), sha256=pinned)
    _print_json(result) if as_json else click.echo(f"imported into {result['cache_dir']} ({result['artifacts']} "
                                                   f"artifacts, {result['files']} files, {result['seconds']:.1f}s)")


@cache_group.command("ls")
@click.option("--json", "as_json", is_flag=True)
def cache_ls_command(as_json):
    """List compile caches with their preset, venv and size."""
    from envkit.cache import store

    rows = store.list_caches()
    if as_json:
        return _print_json(rows)
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
        return _print_json(removed)
    for row in removed:
        click.echo(printable(f"{'would remove' if dry_run else 'removed'} {row['path']}: {row['reason']}"))
    click.echo(f"{len(removed)} caches {'to prune' if dry_run else 'pruned'}")


@main.command("train", context_settings={"ignore_unknown_options": True})
@venv_option
@profile_option
@preset_option
@config_option
@run_dir_options("UTC time and preset")
@click.option("--no-warm", is_flag=True, help="Refuse to start on a cold cache instead of warming it.")
@click.option("--allow-warn", is_flag=True, help="Start despite doctor warnings that train does not handle itself.")
@click.option("--nproc-per-node", "--gpus", "nproc_per_node", type=click.IntRange(min=1), metavar="K",
              help="K processes on this node (one GPU each), started by torchrun.")
@click.option("--nnodes", type=click.IntRange(min=1), metavar="N", help="Nodes in the run; every node runs this command.")
@click.option("--node-rank", type=click.IntRange(min=0), metavar="R", help="This node's rank (torchrun's --node-rank).")
@click.option("--rdzv-endpoint", metavar="HOST:PORT", help="Where the nodes meet (c10d rendezvous; node 0's address).")
@click.option("--rdzv-id", metavar="ID", help="Rendezvous id, the same on every node (default: the run name).")
@rdzv_port_option
@click.option("--max-restarts", type=click.IntRange(min=0), metavar="M",
              help="Restart the worker group up to M times when a worker dies; it resumes from rank 0's checkpoint.")
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
def train_command(venv_path, profile_name, preset, config_path, name, runs_dir, detach, no_warm, allow_warn,
                  nproc_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_id, rdzv_port, max_restarts, trainer_args):
    """Preflight, then run the bundled DFlash trainer with a run directory and log.

    \b
    1. create the profile's venv if it does not exist
    2. doctor: any fail stops the run (warnings too, unless train handles them or --allow-warn)
    3. verify the compile cache; warm it when cold (unless --no-warm)
    4. run `python -m trainer train` in runs/<name>/ with run.json, train.log, metrics.jsonl
    Arguments after `--` go to the trainer, e.g. `envkit train --preset tiny -- --steps 100`.

    \b
    More than one process or node (torchrun's own option names):
      envkit train --nproc-per-node 8                       one node, 8 GPUs
      envkit train --nnodes 2 --nproc-per-node 8 --node-rank R --rdzv-endpoint NODE0:29500
    Each node runs the same command; global rank 0 writes metrics, checkpoints and the summary.
    Under Slurm (`srun --ntasks-per-node=1 envkit train ...`) the node options come from SLURM_*: the nodes,
    this node's rank, the first host of the allocation as endpoint; each node's run dir is <name>-node<R>.
    """
    from envkit.run import slurm
    from envkit.run.launch import TrainRequest, describe_summary, launch_args, start

    _check_preset_choice(preset, config_path)
    placed = slurm.launch_options(os.environ, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                                  rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_port=rdzv_port)
    name = slurm.run_name(os.environ, name)
    launch = launch_args(**(placed | {"rdzv_id": placed["rdzv_id"] or name}), max_restarts=max_restarts)
    request = TrainRequest(venv_path, profile_name, preset, config_path, name, runs_dir, detach, no_warm, allow_warn,
                           tuple(trainer_args), launch)
    record = start(request)
    if not detach:
        click.echo(describe_summary(record, Path(record["run_dir"])))
        sys.exit(0 if record["status"] == "finished" else (130 if record["status"] == "interrupted" else 1))
    click.echo(f"detached: {record['run_dir']}")


@main.command("run", context_settings={"ignore_unknown_options": True})
@venv_option
@profile_option
@run_dir_options("UTC time and the program's name")
@click.option("--allow-warn", is_flag=True, help="Start despite doctor warnings.")
@click.option("--code", "code_dir", type=click.Path(file_okay=False, exists=True), metavar="DIR",
              help="Your training code (default: the working directory): its git commit and uncommitted changes "
                   "key the compile cache.")
@rdzv_port_option
@click.option("--json", "as_json", is_flag=True, help="Print the final run.json.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(venv_path, profile_name, name, runs_dir, detach, allow_warn, code_dir, rdzv_port, as_json, command):
    """Run any training command with envkit's guarantees, e.g. `envkit run -- python train.py --lr 3e-4`.

    \b
    1. create the profile's venv if it does not exist; doctor: any fail stops it (warnings too, unless
       --allow-warn; hazard warnings are settled by the trainer's self-tests)
    2. a private compile cache (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) keyed by the venv and your code;
       verified before the run, fingerprinted after a run that exits 0
    3. COMMAND with the venv's bin first on PATH, in runs/<name>/ with run.json and train.log; Ctrl-C and
       SIGTERM are passed on; the exit code is COMMAND's
    Under Slurm the command is told its place: MASTER_ADDR, MASTER_PORT, ENVKIT_NNODES, ENVKIT_NODE_RANK and
    ENVKIT_RDZV_ENDPOINT (e.g. for `torchrun --nnodes $ENVKIT_NNODES --rdzv-endpoint $ENVKIT_RDZV_ENDPOINT`).
    """
    from envkit.run import slurm
    from envkit.run.command import CommandRequest, describe_command_run, start_command

    request = CommandRequest(tuple(command), venv_path, profile_name, slurm.run_name(os.environ, name), runs_dir,
                             detach, allow_warn, code_dir, slurm.placement_env(os.environ, rdzv_port))
    record = start_command(request, quiet=as_json)
    if as_json:
        _print_json(record)
    elif not detach:
        click.echo(describe_command_run(record), err=True)
    if detach:
        return click.echo(f"detached: {record['run_dir']}") if not as_json else None
    code = record.get("exit_code")
    sys.exit(code if isinstance(code, int) and 0 <= code < 256 else 128 - code if isinstance(code, int) else 1)


@main.command("supervise", hidden=True)
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
def supervise_command(run_dir):
    """Internal: run a prepared run directory (what --detach starts)."""
    from envkit.run.launch import supervise

    supervise(Path(run_dir), echo=True)


@main.command("runs")
@click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR")
@click.option("--json", "as_json", is_flag=True)
def runs_command(runs_dir, as_json):
    """List runs with status, last step, loss, tokens/s, acceptance length and cache hits."""
    from envkit.run.runs import list_runs
    from envkit.text import printable

    rows = list_runs(Path(runs_dir) if runs_dir else None)
    if as_json:
        return _print_json(rows)
    def fmt(value, spec):
        return format(value, spec) if value is not None else format("-", spec.split(".")[0].rstrip("d"))
    click.echo(f"{'name':32} {'status':12} {'step':>6} {'loss':>8} {'Ktok/s':>7} {'tau':>5} {'hits':>5}")
    for row in rows:
        ktoks = row["tokens_per_s"] / 1000 if row["tokens_per_s"] is not None else None
        click.echo(f"{printable(row['name']):32} {printable(row['status']):12} {fmt(row['step'], '>6')} {fmt(row['loss'], '>8.4f')} "
                   f"{fmt(ktoks, '>7.1f')} {fmt(row['acceptance_length'], '>5.2f')} {fmt(row['cache_hits'], '>5')}")


@main.command("export")
@click.argument("run")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Directory to create; refused when not empty unless --force.")
@click.option("--force", is_flag=True, help="Replace a previous export at DIR (never a directory envkit did not write).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              help="Weights dtype (default: the training dtype).")
@click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR")
@click.option("--json", "as_json", is_flag=True)
def export_command(run, out_dir, force, dtype, runs_dir, as_json):
    """Write a run's drafter in the DFlash format that SGLang, vLLM and `dflash` load.

    RUN is a name from `envkit runs` or a run directory. DIR gets config.json (Qwen3 config with
    dflash_config), model.safetensors, README.md (the model card: target, data, walk figures, how to
    serve) and, for a preset's random or built target, target/ (the target as trained against).
    Prints the SGLang and vLLM command lines that serve it.
    """
    from envkit.run.export import export
    from envkit.text import printable

    result = export(run, Path(out_dir), force=force, dtype=dtype, runs_dir=Path(runs_dir) if runs_dir else None)
    if as_json:
        return _print_json(result)
    target = f"{result['out']}/target" if result["target"] == "target/" else result["target"]
    click.echo(printable(f"exported {result['out']} (step {result['step']}; target {target})"))
    serve = result.get("serve") if isinstance(result.get("serve"), dict) else {}
    for engine in ("sglang", "vllm"):
        if isinstance(serve.get(engine), str):
            click.echo(printable(f"  serve with {engine}: {serve[engine]}"))
    click.echo(printable(f"  model card: {result['out']}/README.md"))


@main.command("logs")
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the run ends.")
@click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR")
def logs_command(name, follow, runs_dir):
    """Print a run's train.log."""
    from envkit.run.runs import find_run, follow_log

    follow_log(find_run(name, Path(runs_dir) if runs_dir else None), follow=follow)


if __name__ == "__main__":  # pragma: no cover
    main()
