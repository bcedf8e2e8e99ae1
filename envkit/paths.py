"""Every location envkit uses, resolved in one place so that tests can redirect them."""

from __future__ import annotations

import os
from pathlib import Path

from envkit.support.trainer_helpers import envkit_home

# The checkout that holds envkit/, trainer/ and lockfiles/ (envkit is installed editable).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = "cpu"  # runs anywhere: tests, laptops, the demo
DEFAULT_PRESET = "tiny"  # the trainer's CPU preset (two minutes on two cores)


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else default


def home_dir() -> Path:
    """Where managed venvs, built targets and token stores live: ENVKIT_HOME, default ~/.local/share/envkit (the
    trainer resolves it for itself, so there is one resolver)."""
    return envkit_home()


def venvs_dir() -> Path:
    return home_dir() / "venvs"


def default_venv(profile_name: str) -> Path:
    return venvs_dir() / profile_name


def cache_root() -> Path:
    """Compile caches: ENVKIT_CACHE_DIR, default ~/.cache/envkit."""
    xdg = _env_path("XDG_CACHE_HOME", Path.home() / ".cache")
    return _env_path("ENVKIT_CACHE_DIR", xdg / "envkit")


def lockfiles_dir() -> Path:
    return _env_path("ENVKIT_LOCKFILES", PROJECT_ROOT / "lockfiles")


def trainer_root() -> Path:
    """The directory to put on PYTHONPATH so that `python -m trainer` finds the bundled trainer."""
    return PROJECT_ROOT


def runs_dir() -> Path:
    return _env_path("ENVKIT_RUNS_DIR", Path.cwd() / "runs")


def data_file(name: str) -> Path:
    return Path(__file__).resolve().parent / "data" / name
