"""A managed venv seen from outside: its interpreter, site-packages and envkit.json manifest."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from envkit import paths
from envkit.errors import VenvError
from envkit.support.safeio import UnsafeFile, read_bytes
from envkit.support.text import printable
from envkit.support.trainer_helpers import read_json_file

MANIFEST = "envkit.json"
MANIFEST_LIMIT = 1 << 20


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def is_venv(self) -> bool:
        return (self.path / "pyvenv.cfg").is_file()

    def site_packages(self) -> Path:
        """The site-packages the venv's interpreter loads: lib/pythonX.Y/ for the version pyvenv.cfg names (read
        as data). Another lib/python3*/site-packages beside it is a decoy that doctor reports, never reads."""
        version = re.match(r"(\d+)\.(\d+)", self.python_version())
        if not version:
            raise VenvError(f"{printable(self.path / 'pyvenv.cfg')} names no Python version; the venv is damaged: "
                            f"rebuild it with `envkit create --force --venv {shlex.quote(str(self.path))}`")
        found = self.path / "lib" / f"python{version[1]}.{version[2]}" / "site-packages"
        if not found.is_dir() or found.is_symlink():
            raise VenvError(f"{printable(self.path)} has no lib/python{version[1]}.{version[2]}/site-packages (the "
                            f"version its pyvenv.cfg names); rebuild it with `envkit create --force --venv "
                            f"{shlex.quote(str(self.path))}`")
        return found

    def all_site_packages(self) -> list[Path]:
        """Every lib*/python3*/site-packages dir in the venv, once each (lib64 is usually a link to lib)."""
        by_real = {}
        for path in sorted(self.path.glob("lib*/python3*/site-packages")):
            by_real.setdefault(os.path.realpath(path), path)
        return list(by_real.values())

    def pyvenv_cfg(self) -> dict[str, str]:
        try:
            text = read_bytes(self.path / "pyvenv.cfg", 1 << 16).decode("utf-8")
        except UnicodeDecodeError:
            raise VenvError(f"{self.path / 'pyvenv.cfg'} is not UTF-8 text: the venv is damaged; rebuild it with "
                            f"`envkit create --force --venv {shlex.quote(str(self.path))}`") from None
        except UnsafeFile as exc:
            raise VenvError(f"{printable(self.path / 'pyvenv.cfg')} is unreadable ({exc})") from None
        values = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
        return values

    def python_version(self) -> str:
        """The venv's Python version: uv writes `version_info`, a stdlib venv writes `version`."""
        cfg = self.pyvenv_cfg()
        return cfg.get("version_info") or cfg.get("version", "")

    def manifest(self) -> dict | None:
        """envkit.json, or None when the venv was not made by envkit."""
        if not self.manifest_path.exists() and not self.manifest_path.is_symlink():
            return None
        try:  # never follows a link, never blocks on a FIFO, bounded: the venv may be someone else's
            manifest = read_json_file(self.manifest_path, limit=MANIFEST_LIMIT)
        except ValueError as exc:
            raise VenvError(f"{printable(self.manifest_path)} is unreadable ({exc}); rebuild with "
                            f"`envkit create --force --venv {shlex.quote(str(self.path))}`") from None
        if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), (str, type(None)))
                                                     for k in ("profile", "lock_digest", "python")):
            raise VenvError(f"{self.manifest_path} is not an envkit manifest (a JSON object with profile, lock_digest "
                            f"and python); rebuild with `envkit create --force --venv {shlex.quote(str(self.path))}`")
        return manifest

    def require(self) -> "Venv":
        if not self.is_venv():
            raise VenvError(f"{self.path} is not a venv (no pyvenv.cfg); create one with `envkit create`")
        return self


def resolve_venv(venv_path: str | Path | None, profile_name: str | None) -> Venv:
    """--venv PATH, else the profile's managed venv; it must exist and be a venv."""
    path = Path(venv_path) if venv_path else paths.default_venv(profile_name or paths.DEFAULT_PROFILE)
    venv = Venv(path.expanduser().absolute())
    if not venv.path.exists():
        where = f" --venv {shlex.quote(str(venv_path))}" if venv_path else ""
        raise VenvError(f"{venv.path} does not exist; create it with "
                        f"`envkit create --profile {profile_name or paths.DEFAULT_PROFILE}{where}`")
    return venv.require()
