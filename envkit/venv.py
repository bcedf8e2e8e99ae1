"""A managed venv seen from outside: its interpreter, site-packages and envkit.json manifest."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from envkit.errors import VenvError

MANIFEST = "envkit.json"


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
        found = sorted((self.path / "lib").glob("python3*/site-packages"))
        if not found:
            raise VenvError(f"{self.path} has no lib/python3*/site-packages; recreate it with `envkit create --force`")
        return found[0]

    def pyvenv_cfg(self) -> dict[str, str]:
        try:
            text = (self.path / "pyvenv.cfg").read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise VenvError(f"{self.path / 'pyvenv.cfg'} is not UTF-8 text: the venv is damaged; rebuild it with "
                            f"`envkit create --force --venv {shlex.quote(str(self.path))}`") from None
        except OSError as exc:
            raise VenvError(f"{self.path / 'pyvenv.cfg'} is unreadable ({exc.strerror})") from None
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
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise VenvError(f"{self.manifest_path} is unreadable ({exc}); rebuild with `envkit create --force`") from None
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
    from envkit import paths

    path = Path(venv_path) if venv_path else paths.default_venv(profile_name or paths.DEFAULT_PROFILE)
    venv = Venv(path.expanduser().absolute())
    if not venv.path.exists():
        raise VenvError(f"{venv.path} does not exist; create it with `envkit create --profile {profile_name or paths.DEFAULT_PROFILE}`"
                        + (f" --venv {shlex.quote(str(venv_path))}" if venv_path else ""))
    return venv.require()
