"""Installed distributions of a site-packages directory, read from outside (no imports)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name


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
    with metadata.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                break
            if line[0] in " \t":
                continue  # a folded continuation line; envkit needs none of those fields
            key, sep, value = line.partition(":")
            if sep:
                headers.setdefault(key.strip().lower(), []).append(value.strip())
    return headers


def read_distribution(dist_info: Path) -> Distribution | None:
    metadata = dist_info / "METADATA"
    if not metadata.is_file():
        return None
    headers = _read_headers(metadata)
    if "name" not in headers or "version" not in headers:
        return None
    return Distribution(canonicalize_name(headers["name"][0]), headers["version"][0], dist_info,
                        tuple(headers.get("requires-dist", [])))


def installed_versions(site_packages: Path) -> dict[str, str]:
    """{canonical name: version} of what is installed (one of them, for a duplicated package)."""
    return {d.name: d.version for d in installed_distributions(site_packages)}


def installed_distributions(site_packages: Path) -> list[Distribution]:
    """Every *.dist-info with readable metadata, sorted by name (duplicates kept)."""
    found = [read_distribution(d) for d in sorted(site_packages.glob("*.dist-info")) if d.is_dir()]
    return sorted((d for d in found if d is not None), key=lambda d: (d.name, d.version))
