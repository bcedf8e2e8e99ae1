"""PEP 751 lock files (`pylock.toml`) read as envkit locks.

A pylock file is translated into the shape of an envkit lock profile and then validated by the same code, so
it gets every check a profile gets (names, versions, sha256 hashes, completeness). What is taken from it is
names, versions and hashes only: no URL, path or index the file names is ever followed. Packages come from
the configured index or wheelhouses (`--find-links`, pip's configuration), and uv refuses any archive whose
hash the file does not list.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.markers import InvalidMarker, Marker
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from envkit.errors import ProfileError
from envkit.lock.names import PEP508_NAME
from envkit.support.text import printable

FILE_NAME = re.compile(r"^pylock(\.[^.]+)?\.toml$")  # PEP 751: pylock.toml or pylock.<name>.toml
KNOWN_PYTHONS = tuple(f"3.{minor}" for minor in range(9, 16))


def is_pylock(path: Path, data: dict) -> bool:
    return bool(FILE_NAME.fullmatch(path.name)) or "lock-version" in data


def profile_name(path: Path) -> str:
    """`pylock.toml` -> "pylock", `pylock.train.toml` -> "pylock-train" (a plain profile name)."""
    middle = path.name.removeprefix("pylock").removesuffix(".toml").strip(".")
    name = re.sub(r"[^A-Za-z0-9_-]", "-", f"pylock-{middle}" if middle else "pylock")[:64]
    return name


def python_request(requires: object, path: Path) -> str:
    """The interpreter to build with: this one when requires-python allows it, else the first it allows."""
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    if requires is None:
        return current
    try:
        allowed = SpecifierSet(requires) if isinstance(requires, str) else None
    except InvalidSpecifier:
        allowed = None
    if allowed is None:
        raise ProfileError(f"{printable(path)}: requires-python {printable(repr(requires))} is not a version "
                           f"specifier (e.g. \">=3.11\")")
    for version in (current, *KNOWN_PYTHONS):
        if allowed.contains(version + ".0"):
            return version
    raise ProfileError(f"{printable(path)}: requires-python {printable(requires)} allows no Python envkit knows")


def _applies(entry: dict, where: str, path: Path, groups: frozenset[str]) -> bool:
    """A package whose environment marker is false here (another platform's wheel set, an extra envkit does not
    select, a dependency group outside the file's `default-groups`) is not installed."""
    marker = entry.get("marker")
    if marker is None:
        return True
    if not isinstance(marker, str):
        raise ProfileError(f"{printable(path)}: {where}: marker {printable(repr(marker))} is not a string")
    # PEP 751 markers may test `extras` and `dependency_groups` (packaging's "lock_file" context); a marker can
    # also fail to compare (`python_version ~= 'x'`): any of it is one line about the file, never a traceback.
    environment = {"extras": frozenset(), "dependency_groups": groups}
    try:
        return Marker(marker).evaluate(environment, context="lock_file")
    except (InvalidMarker, ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"{printable(path)}: {where}: marker {printable(repr(marker))} cannot be evaluated "
                           f"({printable(exc)}); fix the marker or export the lock again") from None


def _default_groups(data: dict, path: Path) -> frozenset[str]:
    groups = data.get("default-groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ProfileError(f"{printable(path)}: `default-groups` must be an array of strings")
    return frozenset(groups)


def _hashes(entry: dict, where: str, path: Path) -> list[str]:
    """Every sha256 the file lists for the package's wheels and sdist (uv accepts any of them)."""
    archives = list(entry.get("wheels") or []) + ([entry["sdist"]] if isinstance(entry.get("sdist"), dict) else [])
    if not all(isinstance(archive, dict) for archive in archives):
        raise ProfileError(f"{printable(path)}: {where}: `wheels` must be an array of tables")
    found = []
    for archive in archives:
        hashes = archive.get("hashes")
        if not isinstance(hashes, dict):
            raise ProfileError(f"{printable(path)}: {where}: every wheel and sdist needs `hashes`")
        if isinstance(hashes.get("sha256"), str):
            found.append(f"sha256:{hashes['sha256'].lower()}")
    return sorted(set(found))


def as_profile_data(data: dict, path: Path) -> tuple[dict, list[str]]:
    """The pylock file in envkit's lock shape ({"profile": ..., "package": [...]}) and the packages left out
    (local directories such as the project itself, which no index serves)."""
    version = data.get("lock-version")
    if not isinstance(version, str) or not version.startswith("1."):
        raise ProfileError(f"{printable(path)}: lock-version {printable(repr(version))} is not one envkit reads "
                           f"(PEP 751 version 1.x)")
    entries = data.get("packages", [])
    if not isinstance(entries, list):
        raise ProfileError(f"{printable(path)}: `packages` must be an array of tables ([[packages]])")
    packages, skipped = [], []
    groups = _default_groups(data, path)
    for index, entry in enumerate(entries):
        where = f"[[packages]] #{index + 1}"
        if not isinstance(entry, dict):
            raise ProfileError(f"{printable(path)}: {where} must be a table")
        name = entry.get("name")
        if not _applies(entry, where, path, groups):
            continue
        if "directory" in entry:
            # Printed in create's note: a name that is not a name could carry escapes or forge a line.
            if not isinstance(name, str) or not PEP508_NAME.fullmatch(name):
                raise ProfileError(f"{printable(path)}: {where}: {printable(repr(name))} is not a package name")
            skipped.append(name)
            continue
        if "vcs" in entry or "archive" in entry:
            raise ProfileError(f"{printable(path)}: {where} ({printable(str(name))}) comes from a VCS or an archive "
                               f"URL; envkit installs only index or wheelhouse packages pinned by version and hash")
        if not isinstance(entry.get("version"), str):
            raise ProfileError(f"{printable(path)}: {where} ({printable(str(name))}) has no version; a lock envkit "
                               f"installs pins every package")
        hashes = _hashes(entry, where, path)
        if not hashes:
            raise ProfileError(f"{printable(path)}: {where} ({printable(str(name))}) lists no sha256 hash; a lock "
                               f"envkit installs checks every archive (export it again with hashes)")
        packages.append({"name": name, "version": entry["version"], "hashes": hashes})
    name = profile_name(path)
    profile = {"name": name, "description": f"PEP 751 lock {path.name}",
               "python": python_request(data.get("requires-python"), path),
               "requirements": [f"{p['name']}=={p['version']}" for p in packages if isinstance(p["name"], str)],
               "generated-by": str(data.get("created-by", ""))}
    return {"profile": profile, "package": packages}, skipped
