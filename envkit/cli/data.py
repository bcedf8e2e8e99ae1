"""`envkit data prepare`: a data file tokenized once into a token store."""

from __future__ import annotations

from pathlib import Path

import click

from envkit.cli.app import main, print_json
from envkit.cli.options import check_preset_choice, profile_option, venv_from_options, venv_option
from envkit.support.text import printable


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

    check_preset_choice(preset, config_path)
    venv = venv_from_options(venv_path, profile_name)
    args = ["--data", str(Path(data_path).absolute()),
            *(["--config", str(Path(config_path).absolute())] if config_path else ["--preset", preset or "tiny"]),
            *(["--tokenizer", tokenizer] if tokenizer else []),
            *(["--chat-template-kwargs", chat_template_kwargs] if chat_template_kwargs else []),
            *(["--skip-bad"] if skip_bad else []), *(["--verify"] if verify else [])]
    result = prepare(venv, args)
    if as_json:
        return print_json(result)
    how = "reused" if result["reused"] else f"prepared in {result['seconds']}s ({result['rows_per_s']:,.0f} rows/s)"
    click.echo(printable(f"{result['store']}: {result['rows']:,} rows, {result['tokens']:,} tokens, "
                         f"{result['skipped']} malformed lines skipped; {how}"
                         + ("; every file re-hashed and intact" if result.get("verified") else "")))
