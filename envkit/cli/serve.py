"""`envkit serve`: a serving engine's OpenAI-compatible server from a serve venv, as a supervised run."""

from __future__ import annotations

import sys

import click

from envkit.cli.app import main, print_json
from envkit.support.text import printable


@main.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--venv", "venv_path", type=click.Path(file_okay=False), metavar="PATH",
              help="The serve venv (`envkit create --profile serve-cpu --venv PATH`; serve-vllm, serve-sglang).")
@click.option("--model", "model_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="A local Hugging Face model dir (the target); the server lists it under this path.")
@click.option("--engine", type=click.Choice(["auto", "transformers", "vllm", "sglang"]), default="auto",
              show_default=True, help="auto: the engine of the venv's serve profile.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the server listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--name", metavar="NAME", help="Run name (default: UTC time and 'serve').")
@click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Where run directories go (default: ./runs or $ENVKIT_RUNS_DIR).")
@click.option("--detach", is_flag=True, help="Return once the model is served; the server runs on in tmux.")
@click.option("--ready-timeout", type=click.FloatRange(min=1), default=600, show_default=True, metavar="S",
              help="Seconds to wait for /v1/models to list the model before giving up (and stopping it).")
@click.option("--allow-warn", is_flag=True, help="Start despite doctor warnings.")
@click.option("--stop", "stop_name", metavar="NAME", help="Stop the server run NAME (and nothing else).")
@click.option("--json", "as_json", is_flag=True, help="Print the run.json.")
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
def serve_command(venv_path, model_dir, engine, host, port, name, runs_dir, detach, ready_timeout, allow_warn,
                  stop_name, as_json, engine_args):
    """Serve a model through an OpenAI-compatible API from a serve venv, e.g.
    `envkit serve --venv .venv-serve --model TARGET_DIR --detach`, then `envkit serve --stop NAME`.

    \b
    1. the venv must be a serve venv (envkit recorded creating it from a serve profile) and doctor-clean as one;
       a training venv is refused: serving stacks never go beside training's torch
    2. the engine (transformers serve, vllm serve, sglang) starts in runs/<name>/ (run.json: engine and version,
       the model dir's digest, host, port, pid, lock digest; the server's output in train.log) with nothing of a
       training venv in its environment; arguments after `--` go to the engine
    3. it counts as started once GET /v1/models lists the model; a start that fails or times out is one error
       with the log's last lines, and nothing is left running
    `envkit runs` and `envkit logs NAME` show it; `envkit data regenerate --server URL` talks to it.
    """
    from envkit.serve.server import ServeRequest, start_server, stop_server

    if stop_name:
        if venv_path or model_dir:
            raise click.UsageError("--stop NAME takes no --venv or --model")
        record = stop_server(stop_name, runs_dir)
        if as_json:
            return print_json(record)
        already = record.get("already")
        return click.echo(printable(f"server {stop_name}: {'already ' + already if already else 'stopped'} "
                                    f"({record.get('url')})"))
    if not venv_path or not model_dir:
        raise click.UsageError("give --venv SERVE_VENV and --model DIR (or --stop NAME)")
    request = ServeRequest(venv_path, model_dir, engine, host, port, name, runs_dir, detach, allow_warn,
                           ready_timeout, tuple(engine_args))
    record = start_server(request, quiet=as_json)
    if as_json:
        return print_json(record)
    if detach:
        return click.echo(printable(f"serving: {record['url']}/v1 ({record['name']})"))
    code = record.get("exit_code")
    sys.exit(0 if record.get("status") in ("finished", "interrupted", "stopped") else
             code if isinstance(code, int) and 0 < code < 256 else 1)
