"""Installed distributions of a site-packages directory, read from outside (no imports)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envkit.lock.names import PEP508_NAME
from envkit.support.safeio import UnsafeFile, read_text

# PEP 508's name rule: what a requirement line, a lock and a `pip download` may be given. Anything else
# (`-e DIR #`, `pkg @ file://...`, `x; touch y`) is installer or shell syntax, never a name.
METADATA_LIMIT = 4 << 20  # headers come first; no real METADATA comes near this


@dataclass(frozen=True)
class Distribution:
    name: str  # canonical
    version: str
    dist_info: Path
    requires: tuple[str, ...]  # Requires-Dist lines, markers included

    def record_path(self) -> Path:
        return self.dist_info / "RECORD"


def _read_headers(metadata: Path) -> dict[str, list[str]]:
    """The header block of a METADATA file (stops at the blank line before the description)."""
    headers: dict[str, list[str]] = {}
    for line in read_text(metadata, METADATA_LIMIT).splitlines():
        if not line.strip():
            break
        if line[0] in " \t":
            continue  # a folded continuation line; envkit needs none of those fields
        key, sep, value = line.partition(":")
        if sep:
            headers.setdefault(key.strip().lower(), []).append(value.strip())
    return headers


def parse_dist_info(dist_info: Path) -> tuple[Distribution | None, str | None]:
    """(the distribution a dist-info describes, None) or (None, why it is not one): METADATA must be a regular
    file with a PEP 508 Name and a Version that `packaging` reads."""
    try:
        headers = _read_headers(dist_info / "METADATA")
    except UnsafeFile as exc:
        return None, f"its METADATA is unreadable ({exc})"
    name, version = headers.get("name", [None])[0], headers.get("version", [None])[0]
    if not name or not PEP508_NAME.fullmatch(name):
        return None, f"its METADATA Name {name!r:.80} is not a package name" if name else "its METADATA has no Name"
    if not version:
        return None, "its METADATA has no Version"
    try:
        Version(version)
    except InvalidVersion:
        return None, f"its METADATA Version {version!r:.80} is not a version"
    return Distribution(canonicalize_name(name), version, dist_info, tuple(headers.get("requires-dist", []))), None


def read_distribution(dist_info: Path) -> Distribution | None:
    return parse_dist_info(dist_info)[0]


def invalid_dist_infos(site_packages: Path) -> dict[str, str]:
    """{dist-info name: why} for every *.dist-info that is not a valid distribution."""
    found = {}
    for dist_info in sorted(site_packages.glob("*.dist-info")):
        problem = "not a directory" if not dist_info.is_dir() or dist_info.is_symlink() else \
            parse_dist_info(dist_info)[1]
        if problem:
            found[dist_info.name] = problem
    return found


def installed_versions(site_packages: Path) -> dict[str, str]:
    """{canonical name: version} of what is installed (one of them, for a duplicated package)."""
    return {d.name: d.version for d in installed_distributions(site_packages)}


def installed_distributions(site_packages: Path) -> list[Distribution]:
    """Every *.dist-info with readable metadata, sorted by name (duplicates kept)."""
    found = [read_distribution(d) for d in sorted(site_packages.glob("*.dist-info"))
             if d.is_dir() and not d.is_symlink()]
    return sorted((d for d in found if d is not None), key=lambda d: (d.name, d.version))
