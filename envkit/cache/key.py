"""The env key: what decides whether compiled artifacts can be reused, and the private dir they live in.

Layout: <cache root>/compile/<env key>/{inductor,triton,fingerprint.json}, dirs 0700, plus a
sibling `<env key>.lock` that serialises warmers (HAZARDS.md H5, H6).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

from envkit import paths
from envkit.support.trust import permission_problem, tree_problems
from envkit.errors import CacheError
from envkit.trainerproc.process import run_trainer, trainer_args, trainer_env
from envkit.trainerproc.source import trainer_digest
from envkit.venv.managed import Venv

CACHE_SUBDIRS = ("inductor", "triton")


def describe(venv: Venv, preset: str | None, config: str | None, extra_args: tuple[str, ...] = ()) -> dict:
    """The trainer's own account of versions, device and the resolved config (preset or file, then the
    trainer's own flags), from the venv's interpreter."""
    return json.loads(run_trainer(venv, ["describe", *trainer_args(preset, config), *extra_args],
                                  trainer_env(venv, None), timeout=300).stdout)


def key_parts(venv: Venv, preset: str | None, config: str | None, described: dict | None = None) -> dict:
    """What decides whether compiled artifacts can be reused."""
    described = described or describe(venv, preset, config)
    config_digest = hashlib.sha256(json.dumps(described["config"], sort_keys=True).encode()).hexdigest()[:16]
    return {"torch": described["torch"], "cuda": described["cuda"], "triton": described["triton"],
            "python": described["python"], "device": described["device"], "trainer": trainer_digest(),
            "preset": described["preset"], "config": config_digest}


def env_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def compile_root() -> Path:
    return paths.cache_root() / "compile"


def ensure_private_dir(path: Path) -> None:
    """Create `path` (and the compile root) 0700; refuse one with any entry others own or can write, or a link."""
    try:
        for directory in (compile_root(), path, *(path / sub for sub in CACHE_SUBDIRS)):
            if not directory.is_symlink():
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if directory == compile_root():
                # The root may be a link the user made (a cache on another disk); what is under it may not.
                problem = permission_problem(directory.resolve())
                if problem:
                    raise CacheError(f"compile cache dir {directory} is {problem}; fix with `chmod -R go-rwx "
                                     f"{directory}` (if it is yours) or set ENVKIT_CACHE_DIR to a private dir")
        problems = tree_problems(path)
        if problems:
            raise CacheError(untrusted_message(path, problems))
    except OSError as exc:
        raise CacheError(f"cannot create the compile cache at {path}: {exc.strerror}; set ENVKIT_CACHE_DIR to a "
                         f"writable dir") from None


def untrusted_message(cache_dir: Path, problems: dict[str, str]) -> str:
    named = "; ".join(f"{name}: {why}" for name, why in list(problems.items())[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return (f"compile cache {cache_dir} cannot be trusted: {named}{more}; if every file is yours, "
            f"`chmod -R go-w {shlex.quote(str(cache_dir))}` and remove the links, else "
            f"`rm -rf {shlex.quote(str(cache_dir))}` and run `envkit warm-cache`")

