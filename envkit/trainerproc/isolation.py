"""The two venvs never see each other: what a server's environment and a training run's environment leave out.

A server gets nothing of training: no compile cache variable (TORCHINDUCTOR_*, TRITON_*), no envkit variable, no
PYTHONPATH, and no other venv's bin/ on PATH. A training run gets no serving engine's variables (VLLM_*, SGLANG_*,
SGL_*, FLASHINFER_*), which would steer nothing of its own and hint that one venv serves both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

TRAINING_PREFIXES = ("TORCHINDUCTOR_", "TRITON_", "ENVKIT_")
ENGINE_PREFIXES = ("VLLM_", "SGLANG_", "SGL_", "FLASHINFER_")
INTERPRETER_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")


def _is_venv_bin(entry: str) -> bool:
    return bool(entry) and (Path(entry).parent / "pyvenv.cfg").is_file()


def venv_path_env(environ: Mapping[str, str], venv_path: Path) -> dict[str, str]:
    """The venv activated: its bin/ first on PATH and no other venv's bin/ after it."""
    entries = [entry for entry in environ.get("PATH", os.defpath).split(os.pathsep) if not _is_venv_bin(entry)]
    return {"VIRTUAL_ENV": str(venv_path), "PATH": os.pathsep.join([str(venv_path / "bin"), *entries])}


def server_env(environ: Mapping[str, str], venv_path: Path) -> dict[str, str]:
    """What `envkit serve` starts an engine with."""
    kept = {name: value for name, value in environ.items()
            if not name.startswith(TRAINING_PREFIXES) and name not in INTERPRETER_VARIABLES}
    return kept | venv_path_env(environ, venv_path)


def without_engine_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a training process: no serving engine's variables."""
    return {name: value for name, value in environ.items() if not name.startswith(ENGINE_PREFIXES)}
