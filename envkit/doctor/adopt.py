"""`envkit lock --from-venv`: a lock profile pinned to what an existing venv holds, strays left out.

For the user whose venv works today: the profile's requirements are every installed distribution
at its installed version (minus what the stray catalog flags, unless --keep-strays), resolved and
hashed the usual way, so that `envkit create --profile NAME` rebuilds that venv tomorrow.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from envkit import __version__, paths
from envkit.doctor.context import Context
from envkit.doctor.packages import stray_reasons
from envkit.errors import ProfileError
from envkit.venv.installed import invalid_dist_infos
from envkit.lock import profile as profiles
from envkit.lock import wheelhouse
from envkit.lock.profile import DEFAULT_PLATFORM, Profile
from envkit.lock.resolve import compile_packages
from envkit.lock.uvtool import uv_version
from envkit.venv.managed import Venv
from envkit.support.trainer_helpers import atomic_write


@dataclass(frozen=True)
class AdoptResult:
    path: str
    packages: int
    left_out: dict  # stray name -> why


def _torch_backend(version: str | None) -> str | None:
    """The PyTorch backend a torch build came from, by its local label: 2.13.0+cpu -> cpu, +cu130 -> cu130."""
    label = (version or "").partition("+")[2]
    return label if label == "cpu" or (label.startswith("cu") and label[2:].isdigit()) else None


def adopt(venv_path: str, profile_name: str | None, lock_path: str | None, *, keep_strays: bool = False,
          find_links=(), offline: bool = False, no_index: bool = False) -> AdoptResult:
    if not profile_name and not lock_path:
        raise ProfileError("--from-venv needs --profile NAME (writes lockfiles/NAME.toml) or --lock FILE")
    venv = Venv(Path(venv_path).expanduser().absolute()).require()
    name = profiles.check_profile_name(profile_name or Path(lock_path).stem, "--profile")
    target = Path(lock_path) if lock_path else paths.lockfiles_dir() / f"{name}.toml"
    if target.exists():
        raise ProfileError(f"{target} exists; choose another --profile/--lock (envkit does not overwrite a lock "
                           f"with one adopted from a venv)")
    ctx = Context(venv, None, {})
    invalid = invalid_dist_infos(ctx.site_packages)
    if invalid:  # never dropped in silence: the lock would not be the venv
        name, why = next(iter(invalid.items()))
        raise ProfileError(f"{venv.path}: {name} is not a valid distribution ({why}); `envkit doctor` names every "
                           f"such folder; repair the venv before adopting it")
    strays = {} if keep_strays else stray_reasons(ctx)
    duplicated = sorted(n for n, dists in ctx.by_name.items() if len(dists) > 1)
    if duplicated:
        raise ProfileError(f"{venv.path} holds two versions of {', '.join(duplicated)} (a half-finished swap); "
                           f"`envkit doctor` shows which; repair it before adopting")
    requirements = tuple(f"{n}=={dists[0].version}" for n, dists in sorted(ctx.by_name.items()) if n not in strays)
    torch = ctx.by_name.get("torch")
    python = ".".join(venv.python_version().split(".")[:2])
    profile = Profile(name=name, description=f"adopted from {venv.path}", python=python,
                      torch_backend=_torch_backend(torch[0].version if torch else None), platform=DEFAULT_PLATFORM,
                      requirements=requirements, generated_by=f"envkit {__version__} / uv {uv_version()}",
                      path=target)
    packages = compile_packages(profile, wheelhouse.find_links(find_links), offline=offline, no_index=no_index)
    profile = dataclasses.replace(profile, packages=packages)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, profiles.render(profile))
    return AdoptResult(str(target), len(packages), strays)
