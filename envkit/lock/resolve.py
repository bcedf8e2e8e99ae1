"""`envkit lock`: regenerate a profile's [[package]] table from its requirements with uv."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from envkit import __version__
from envkit.errors import EnvkitError, ProfileError
from envkit.lock import profile as profiles
from envkit.lock import wheelhouse
from envkit.lock.profile import LockedPackage, Profile
from envkit.lock.uvtool import run_uv, uv_version
from envkit.support.trainer_helpers import atomic_write


@dataclass(frozen=True)
class LockResult:
    path: Path
    changed: bool
    packages: int
    added: tuple[str, ...]
    removed: tuple[str, ...]
    updated: tuple[str, ...]  # "name old -> new"


def parse_hashed_requirements(text: str) -> tuple[LockedPackage, ...]:
    """Parse `uv pip compile --generate-hashes --no-annotate --no-header` output."""
    packages: list[LockedPackage] = []
    for logical in text.replace("\\\n", " ").splitlines():
        logical = logical.split("#", 1)[0].strip()
        if not logical:
            continue
        fields = logical.split()
        name, sep, version = fields[0].partition("==")
        if not sep:
            raise EnvkitError(f"uv produced a line envkit cannot read: {logical!r}")
        name = name.split("[", 1)[0]
        hashes = sorted(f.removeprefix("--hash=") for f in fields[1:] if f.startswith("--hash="))
        packages.append(LockedPackage(canonicalize_name(name), version, tuple(hashes)))
    return tuple(sorted(packages, key=lambda p: p.name))


def torch_backend_args(profile: Profile, links: list[str], offline: bool) -> list[str]:
    """uv's --torch-backend, unless a wheelhouse carries torch or we are offline.

    uv's torch backend makes the PyTorch index the only source of torch, so a wheelhouse that
    holds the build (an air-gapped mirror) would be ignored; there the wheelhouse wins.
    """
    if not profile.torch_backend or offline:
        return []
    for link in links:
        if "://" not in link and any(Path(link).glob("torch-*.whl")):
            return []
    return ["--torch-backend", profile.torch_backend]


def source_args(profile: Profile, links: list[str], *, offline: bool, no_index: bool) -> list[str]:
    args = wheelhouse.uv_args(links) + torch_backend_args(profile, links, offline)
    if offline:
        args.append("--offline")
    if no_index:
        args.append("--no-index")
    return args


def _python_version(profile: Profile) -> str:
    return profile.python.removeprefix("python").removeprefix("cpython-")


def compile_packages(profile: Profile, links: list[str], *, offline: bool = False,
                     no_index: bool = False) -> tuple[LockedPackage, ...]:
    if not profile.requirements:
        raise ProfileError(f"{profile.path}: `requirements` is empty; list what the environment needs")
    with tempfile.TemporaryDirectory(prefix="envkit-lock-") as tmp:
        req_in = Path(tmp) / "requirements.in"
        req_in.write_text("\n".join(profile.requirements) + "\n")
        out = run_uv(["pip", "compile", str(req_in), "--generate-hashes", "--no-header", "--no-annotate",
                      "--python-version", _python_version(profile), "--python-platform", profile.platform,
                      *(["--exclude-newer", profile.exclude_newer] if profile.exclude_newer else []),
                      "--quiet", *source_args(profile, links, offline=offline, no_index=no_index)])
    return parse_hashed_requirements(out)


def _diff(old: Profile, new: Profile) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    old_versions = {p.name: p.version for p in old.packages}
    new_versions = {p.name: p.version for p in new.packages}
    added = tuple(sorted(set(new_versions) - set(old_versions)))
    removed = tuple(sorted(set(old_versions) - set(new_versions)))
    updated = tuple(f"{n} {old_versions[n]} -> {new_versions[n]}" for n in sorted(set(old_versions) & set(new_versions))
                    if old_versions[n] != new_versions[n])
    return added, removed, updated


def lock(profile_name: str | None, lock_path: str | None, *, find_links: tuple[str, ...] = (),
         offline: bool = False, no_index: bool = False, check: bool = False) -> LockResult:
    """Re-resolve the profile; write it (or, with check, only report whether it is out of date)."""
    old = profiles.load(profile_name, lock_path)
    if old.pep751:
        raise ProfileError(f"{old.path} is a PEP 751 lock: the tool that wrote it re-locks it (e.g. `uv export "
                           f"--format pylock.toml`); envkit installs from it as it is")
    links = wheelhouse.find_links(find_links)
    packages = compile_packages(old, links, offline=offline, no_index=no_index)
    changed = packages != old.packages
    # Keep the old stamp when nothing changed, so that a re-lock leaves the file byte-identical.
    stamp = f"envkit {__version__} / uv {uv_version()}" if changed else old.generated_by
    new = dataclasses.replace(old, packages=packages, generated_by=stamp)
    if not check and (changed or profiles.render(new) != old.path.read_text()):
        atomic_write(old.path, profiles.render(new))
    return LockResult(old.path, changed, len(packages), *_diff(old, new))


def export_pylock(profile_name: str | None, lock_path: str | None, target: Path, *,
                  find_links: tuple[str, ...] = (), offline: bool = False, no_index: bool = False) -> Path:
    """Write the locked set as a PEP 751 pylock.toml for other tools (uv resolves the file URLs)."""
    profile = profiles.load(profile_name, lock_path)
    if not profile.packages:
        raise ProfileError(f"{profile.path} has no [[package]] table yet; run `envkit lock` first")
    links = wheelhouse.find_links(find_links)
    with tempfile.TemporaryDirectory(prefix="envkit-export-") as tmp:
        pins = Path(tmp) / "pins.txt"
        pins.write_text(profile.requirements_txt())
        out = Path(tmp) / "pylock.toml"
        run_uv(["pip", "compile", str(pins), "--no-deps", "--format", "pylock.toml", "-o", str(out), "--quiet",
                "--python-version", _python_version(profile), "--python-platform", profile.platform,
                *source_args(profile, links, offline=offline, no_index=no_index)])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, target)
    return target
