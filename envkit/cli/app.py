"""The `envkit` command group: errors become one `Error:` line and an exit code; JSON output."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from envkit import __version__
from envkit.errors import EnvkitError
from envkit.support.text import printable


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def as_dict(result) -> dict:
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
