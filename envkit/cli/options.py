"""Options several commands share (lock profile, wheelhouses, venv, preset, run dir), and their checks."""

from __future__ import annotations

import click

from envkit.errors import EnvkitError
from envkit.support.trainer_helpers import presets_help

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


def all_options(options):
    """One decorator applying click options in the order listed."""
    def apply(func):
        for option in reversed(options):
            func = option(func)
        return func
    return apply


with_sources = all_options(source_options)


def run_dir_options(default_name: str):
    """--name, --runs-dir and --detach: where a run (train's or run's) goes and whether it detaches."""
    return all_options([
        click.option("--name", metavar="NAME", help=f"Run name (default: {default_name})."),
        click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR",
                     help="Where run directories go (default: ./runs or $ENVKIT_RUNS_DIR)."),
        click.option("--detach", is_flag=True,
                     help="Run in a tmux session (or a new session without tmux) and return."),
    ])


rdzv_port_option = click.option("--rdzv-port", type=click.IntRange(1, 65535), metavar="PORT",
                                help="Under Slurm: the rendezvous port on the first node (default 29500).")


venv_option = click.option("--venv", "venv_path", type=click.Path(file_okay=False), metavar="PATH",
                           help="The managed venv (default: the profile's, $ENVKIT_HOME/venvs/<profile>).")


preset_option = click.option("--preset", default=None, metavar="NAME", help=f"Trainer preset ({presets_help()}).")


config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True), metavar="PATH",
                             help="A JSON trainer config instead of a preset.")


def venv_from_options(venv_path, profile_name):
    from envkit.venv.managed import resolve_venv

    return resolve_venv(venv_path, profile_name)  # a VenvError: `Error: ...`, exit 1


def training_venv_from_options(venv_path, profile_name, what: str):
    """The venv of a command that runs the bundled trainer in it (`what` does so): a serve venv is refused in one
    line, by the role every command derives the same way (venvrecord.role_for)."""
    from envkit.run.preflight import require_role

    venv = venv_from_options(venv_path, profile_name)
    if venv.path.exists():
        try:
            require_role(venv, None if not profile_name else _profile(profile_name), "train")
        except EnvkitError as exc:
            raise EnvkitError(f"{exc} ({what} runs the bundled trainer, which belongs in a training venv)") from None
    return venv


def _profile(name):
    from envkit.lock import profile as profiles

    return profiles.load(name)


def check_profile_choice(profile_name, lock_path) -> None:
    if profile_name and lock_path:
        raise click.UsageError("give --profile or --lock, not both")


def check_preset_choice(preset, config_path) -> None:
    if preset and config_path:
        raise click.UsageError("give --preset or --config, not both")
