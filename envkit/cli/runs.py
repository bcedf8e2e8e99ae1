"""`envkit train`, `envkit run`, `envkit runs`, `envkit logs` and `envkit export`: runs and what they leave."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from envkit.cli.app import main, print_json
from envkit.cli.options import (check_preset_choice, config_option, preset_option, profile_option, rdzv_port_option,
                                run_dir_options, venv_option)


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

    check_preset_choice(preset, config_path)
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
        print_json(record)
    elif not detach:
        click.echo(describe_command_run(record), err=True)
    if detach:
        return click.echo(f"detached: {record['run_dir']}") if not as_json else None
    code = record.get("exit_code")
    sys.exit(code if isinstance(code, int) and 0 <= code < 256 else 128 - code if isinstance(code, int) else 1)


@main.command("supervise", hidden=True)
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--environ-fifo", type=click.Path(dir_okay=False), help="Where the launcher hands over its environment.")
def supervise_command(run_dir, environ_fifo):
    """Internal: run a prepared run directory (what --detach starts)."""
    from envkit.run.supervise import receive_environment, supervise

    environ = receive_environment(Path(environ_fifo)) if environ_fifo else None
    supervise(Path(run_dir), echo=True, environ=environ)


@main.command("runs")
@click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR")
@click.option("--json", "as_json", is_flag=True)
def runs_command(runs_dir, as_json):
    """List runs with status, last step, loss, tokens/s, acceptance length and cache hits."""
    from envkit.run.history import list_runs
    from envkit.support.text import printable

    rows = list_runs(Path(runs_dir) if runs_dir else None)
    if as_json:
        return print_json(rows)
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
    from envkit.support.text import printable

    result = export(run, Path(out_dir), force=force, dtype=dtype, runs_dir=Path(runs_dir) if runs_dir else None)
    if as_json:
        return print_json(result)
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
    from envkit.run.history import find_run, follow_log

    follow_log(find_run(name, Path(runs_dir) if runs_dir else None), follow=follow)
