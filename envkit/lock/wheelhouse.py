"""Wheelhouses (find-links) from envkit's flags and environment and from pip's own configuration.

Corporate mirrors and air-gapped clusters configure pip; uv does not read pip's files, so envkit
reads them and hands the directories to uv. Nothing here names a machine path: every location
comes from configuration.
"""

from __future__ import annotations

import configparser
import os
import sys
from pathlib import Path

from envkit.errors import ProfileError
from envkit.support.text import printable


def _pip_config_files() -> list[Path]:
    """pip's configuration files in pip's own order (global, user, site, then PIP_CONFIG_FILE); none at all when
    PIP_CONFIG_FILE is os.devnull, as pip itself reads it."""
    if os.environ.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d]
    files += [Path("/etc/pip.conf"), Path.home() / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf",
              Path(sys.prefix) / "pip.conf"]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    return files


def _split(value: str) -> list[str]:
    """Whitespace-separated entries; a local entry may also hold os.pathsep-separated paths, a URL never."""
    parts = []
    for entry in value.split():
        parts += [entry] if "://" in entry else [p for p in entry.split(os.pathsep) if p]
    return parts


def pip_find_links() -> list[str]:
    """`find-links` of pip's [global] and [install] sections and PIP_FIND_LINKS."""
    found: list[str] = []
    for path in _pip_config_files():
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue  # pip would complain about a broken file; envkit only skips it
        for section in ("global", "install"):
            if parser.has_option(section, "find-links"):
                found += _split(parser.get(section, "find-links"))
    found += _split(os.environ.get("PIP_FIND_LINKS", ""))
    return found


def find_links(explicit: list[str] | tuple[str, ...] = (), *, use_pip_config: bool = True) -> list[str]:
    """All wheelhouses, first seen first: flags, ENVKIT_FIND_LINKS, UV_FIND_LINKS, pip's config."""
    candidates = list(explicit)
    candidates += _split(os.environ.get("ENVKIT_FIND_LINKS", ""))
    candidates += _split(os.environ.get("UV_FIND_LINKS", ""))
    if use_pip_config:
        candidates += pip_find_links()
    seen: list[str] = []
    for candidate in candidates:
        # A relative flag value means the caller's directory; a URL stays as it is.
        value = candidate if "://" in candidate else _local(candidate)
        if value not in seen:
            seen.append(value)
    return seen


def _local(candidate: str) -> str:
    try:
        return str(Path(candidate).expanduser().resolve())
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before Python 3.13), an unreadable dir
        raise ProfileError(f"wheelhouse {printable(candidate)}: {printable(str(exc))}; give a directory of wheels") from None


def uv_args(links: list[str]) -> list[str]:
    return [arg for link in links for arg in ("--find-links", link)]
