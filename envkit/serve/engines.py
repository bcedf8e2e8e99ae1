"""The serving engines `envkit serve` starts, each as its own OpenAI-compatible server from a serve venv.

Every engine serves the model under the path it was given (`/v1/models` lists that id), so readiness and
`envkit data regenerate --model` use the same string.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envkit.errors import RunError
from envkit.venv.installed import installed_versions
from envkit.venv.managed import Venv


@dataclass(frozen=True)
class Engine:
    name: str
    package: str  # the distribution whose version the run records

    def command(self, venv: Venv, model: Path, host: str, port: int, extra: tuple[str, ...]) -> list[str]:
        where = ("--host", host, "--port", str(port))
        if self.name == "transformers":
            return [str(venv.path / "bin" / "transformers"), "serve", str(model), *where, *extra]
        if self.name == "vllm":
            return [str(venv.path / "bin" / "vllm"), "serve", str(model), *where, *extra]
        return [str(venv.python), "-m", "sglang.launch_server", "--model-path", str(model), *where, *extra]


ENGINES = {engine.name: engine for engine in (Engine("transformers", "transformers"), Engine("vllm", "vllm"),
                                              Engine("sglang", "sglang"))}


def pick(requested: str, recorded: str | None, venv: Venv) -> tuple[Engine, str]:
    """The engine to start and its installed version: the one asked for, else the serve profile's, and it must be
    installed in the venv."""
    name = recorded if requested == "auto" else requested
    if name not in ENGINES:
        raise RunError(f"no engine known for {venv.path}: pass --engine transformers, vllm or sglang")
    engine = ENGINES[name]
    version = installed_versions(venv.site_packages()).get(engine.package)
    if version is None:
        raise RunError(f"{venv.path} has no {engine.package}: --engine {name} needs a serve venv of its profile "
                       f"(`envkit create --profile serve-{'cpu' if name == 'transformers' else name} --venv DIR`)")
    return engine, version
