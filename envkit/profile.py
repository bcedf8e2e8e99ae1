"""Lock profiles: the intent (requirements) plus the resolved, hash-pinned package table."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from envkit import paths
from envkit.errors import ProfileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


DEFAULT_PLATFORM = "x86_64-manylinux_2_28"


@dataclass(frozen=True)
class LockedPackage:
    name: str  # canonical (PEP 503) name
    version: str  # full version, local label included: 2.13.0+cpu
    hashes: tuple[str, ...]  # "sha256:<hex>", sorted

    def requirement_line(self) -> str:
        hashes = " ".join(f"--hash={h}" for h in self.hashes)
        return f"{self.name}=={self.version} {hashes}"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    python: str  # interpreter request given to `uv venv --python`
    torch_backend: str | None  # uv's --torch-backend (cpu, cu130, ...); None = the index decides
    # Locks are resolved for the cluster's platform, not the laptop that runs `envkit lock`.
    platform: str
    requirements: tuple[str, ...]  # what people edit; [[package]] is generated from it
    generated_by: str
    packages: tuple[LockedPackage, ...] = field(default=())
    path: Path | None = None

    @property
    def lock_digest(self) -> str:
        """sha256 of the canonical package table: the identity of an environment."""
        canonical = [[p.name, p.version, list(p.hashes)] for p in sorted(self.packages, key=lambda p: p.name)]
        return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()

    def package(self, name: str) -> LockedPackage | None:
        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)

    def requirements_txt(self) -> str:
        """The package table as a hashed requirements file for `uv pip sync --require-hashes`."""
        return "".join(p.requirement_line() + "\n" for p in self.packages)


def known_profiles() -> list[str]:
    return sorted(p.stem for p in paths.lockfiles_dir().glob("*.toml"))


def resolve_profile_path(name: str | None, lock_path: str | Path | None) -> Path:
    """`--profile NAME` or `--lock PATH` to a file, with a helpful error for unknown names."""
    if lock_path is not None:
        path = Path(lock_path)
        if not path.is_file():
            raise ProfileError(f"lock file {path} does not exist; give an existing file to --lock")
        return path
    name = name or "cpu"
    path = paths.lockfiles_dir() / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(known_profiles()) or "none"
        raise ProfileError(f"unknown profile {name!r} (known: {known}); or give a file with --lock PATH")
    return path


def load(name: str | None = None, lock_path: str | Path | None = None) -> Profile:
    return load_file(resolve_profile_path(name, lock_path))


def load_file(path: Path) -> Profile:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:  # its message carries line and column
        raise ProfileError(f"{path}: invalid TOML: {exc}; fix the file or run `git checkout {path}`") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from None
    return parse(data, path)


def _require(table: dict, key: str, kind: type, where: str, path: Path):
    if key not in table:
        raise ProfileError(f"{path}: {where} is missing the field {key!r}")
    value = table[key]
    if not isinstance(value, kind):
        raise ProfileError(f"{path}: {where}.{key} must be a {kind.__name__}, not {type(value).__name__}")
    return value


def parse(data: dict, path: Path) -> Profile:
    table = data.get("profile")
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: no [profile] table; see lockfiles/cpu.toml for the format")
    requirements = _require(table, "requirements", list, "[profile]", path)
    packages = []
    for index, entry in enumerate(data.get("package", [])):
        where = f"[[package]] #{index + 1}"
        name = _require(entry, "name", str, where, path)
        version = _require(entry, "version", str, where, path)
        hashes = _require(entry, "hashes", list, where, path)
        if not hashes or not all(isinstance(h, str) and h.startswith("sha256:") for h in hashes):
            raise ProfileError(f"{path}: {where} ({name}) needs sha256 hashes; run `envkit lock --lock {path}`")
        packages.append(LockedPackage(canonicalize_name(name), version, tuple(sorted(hashes))))
    return Profile(
        name=_require(table, "name", str, "[profile]", path),
        description=table.get("description", ""),
        python=_require(table, "python", str, "[profile]", path),
        torch_backend=table.get("torch-backend"),
        platform=table.get("platform", DEFAULT_PLATFORM),
        requirements=tuple(requirements),
        generated_by=table.get("generated-by", ""),
        packages=tuple(sorted(packages, key=lambda p: p.name)),
        path=path,
    )


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render(profile: Profile) -> str:
    """Deterministic TOML: sorted packages, one hash per line, so diffs show content changes only."""
    lines = [
        "[profile]",
        f"name = {_toml_string(profile.name)}",
        f"description = {_toml_string(profile.description)}",
        f"python = {_toml_string(profile.python)}",
    ]
    if profile.torch_backend:
        lines.append(f"torch-backend = {_toml_string(profile.torch_backend)}")
    lines.append(f"platform = {_toml_string(profile.platform)}")
    lines.append("requirements = [")
    lines += [f"    {_toml_string(r)}," for r in profile.requirements]
    lines.append("]")
    lines.append(f"generated-by = {_toml_string(profile.generated_by)}")
    for package in sorted(profile.packages, key=lambda p: p.name):
        lines += ["", "[[package]]", f"name = {_toml_string(package.name)}",
                  f"version = {_toml_string(package.version)}", "hashes = ["]
        lines += [f"    {_toml_string(h)}," for h in package.hashes]
        lines.append("]")
    return "\n".join(lines) + "\n"
