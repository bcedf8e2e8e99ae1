"""Lock profiles: the intent (requirements) plus the resolved, hash-pinned package table."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envkit import paths
from envkit.errors import ProfileError
from envkit.lock import pylock
from envkit.lock.names import PEP508_NAME
from envkit.support.safeio import UnsafeFile, read_bytes
from envkit.support.text import printable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCK_LIMIT = 64 << 20  # a cuda profile with every hash is about 100 KB


DEFAULT_PLATFORM = "x86_64-manylinux_2_28"
# A lock is data handed to uv: every field is checked against these before any tool reads it.
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # also a file and directory name
SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
EXCLUDE_NEWER = re.compile(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}Z)?")
PLAIN_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+*<>=!~,-]{0,63}$")  # python request, backend, platform


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
    pep751: bool = False  # read from a pylock.toml: another tool writes it, envkit only reads it
    # "train" (the default) or "serve": a serve profile's venv runs a serving engine and never trains; its engine
    # (transformers, vllm, sglang) is what `envkit serve --engine auto` starts.
    role: str = "train"
    engine: str | None = None
    # Resolve as the index stood then (uv's --exclude-newer, RFC 3339): `envkit lock --check` of a profile that
    # names it keeps holding when a dependency releases tomorrow.
    exclude_newer: str | None = None
    left_out: tuple[str, ...] = ()  # a pylock's local directory packages (the project itself): no index serves them

    @property
    def lock_digest(self) -> str:
        """sha256 of the canonical package table: the identity of an environment."""
        canonical = [[p.name, p.version, list(p.hashes)] for p in sorted(self.packages, key=lambda p: p.name)]
        return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()

    def package(self, name: str) -> LockedPackage | None:
        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)

    def check_complete(self) -> None:
        """Before anything is installed: the package table satisfies the profile's own requirements, so a lock
        cut short or edited by hand is refused (`envkit lock` regenerates the table and needs no such check)."""
        _check_requirements(list(self.requirements), list(self.packages), self.path)

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
    name = name or paths.DEFAULT_PROFILE
    check_profile_name(name, "--profile")
    path = paths.lockfiles_dir() / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(known_profiles()) or "none"
        raise ProfileError(f"unknown profile {name!r} (known: {known}); or give a file with --lock PATH")
    return path


def check_profile_name(name: str, where: str) -> str:
    """A profile name names a file in lockfiles/ and a venv dir: a plain name, nothing that walks paths."""
    if not isinstance(name, str) or not PROFILE_NAME.fullmatch(name):
        raise ProfileError(f"{where}: profile name {name!r} must be letters, digits, '-' or '_' (at most 64, "
                           f"starting with a letter or digit)")
    return name


def load(name: str | None = None, lock_path: str | Path | None = None) -> Profile:
    return load_file(resolve_profile_path(name, lock_path))


def load_file(path: Path) -> Profile:
    try:  # a lock is data: a regular file, bounded, not followed into a FIFO or a device
        data = tomllib.loads(read_bytes(path, LOCK_LIMIT).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{printable(path)}: not UTF-8 text (byte {exc.start}); a lock is a TOML text file") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:  # its message carries line and column
        raise ProfileError(f"{printable(path)}: invalid TOML: {printable(exc)}; fix the file or run "
                           f"`git checkout {shlex.quote(str(path))}`") from None
    except UnsafeFile as exc:
        raise ProfileError(f"{printable(path)}: cannot read: {exc}") from None
    if pylock.is_pylock(path, data):
        translated, local = pylock.as_profile_data(data, path)
        return dataclasses.replace(parse(translated, path), pep751=True, left_out=tuple(local))
    return parse(data, path)


def _require(table: dict, key: str, kind: type, where: str, path: Path):
    if key not in table:
        raise ProfileError(f"{path}: {where} is missing the field {key!r}")
    value = table[key]
    if not isinstance(value, kind):
        raise ProfileError(f"{path}: {where}.{key} must be a {kind.__name__}, not {type(value).__name__}")
    return value


def _package(entry, where: str, path: Path) -> LockedPackage:
    if not isinstance(entry, dict):
        raise ProfileError(f"{path}: {where} must be a table")
    name = _require(entry, "name", str, where, path)
    if not PEP508_NAME.fullmatch(name):
        raise ProfileError(f"{path}: {where}: {name!r} is not a package name; run `envkit lock --lock {path}`")
    version = _require(entry, "version", str, where, path)
    try:
        Version(version)
        if any(c.isspace() for c in version):  # Version() accepts surrounding whitespace; a requirements line must not
            raise InvalidVersion(version)
    except InvalidVersion:
        raise ProfileError(f"{path}: {where} ({name}): {version!r} is not a version; run `envkit lock --lock "
                           f"{path}`") from None
    hashes = _require(entry, "hashes", list, where, path)
    if not hashes or not all(isinstance(h, str) and SHA256.fullmatch(h) for h in hashes):
        raise ProfileError(f"{path}: {where} ({name}) needs hashes of the form sha256:<64 hex digits>; run "
                           f"`envkit lock --lock {path}`")
    return LockedPackage(canonicalize_name(name), version, tuple(sorted(hashes)))


def _plain(table: dict, key: str, path: Path, default: str | None) -> str | None:
    value = table.get(key, default)
    if value is not None and (not isinstance(value, str) or not PLAIN_VALUE.fullmatch(value)):
        raise ProfileError(f"{path}: [profile].{key} = {value!r} is not a plain value (letters, digits, . + - and "
                           f"version operators)")
    return value


def _marker_holds(requirement: Requirement, line: str, path: Path) -> bool:
    try:
        return requirement.marker.evaluate()
    except (ValueError, KeyError, TypeError) as exc:  # a comparison packaging cannot make, a name it lacks
        raise ProfileError(f"{path}: the marker of requirement {line!r} cannot be evaluated ({exc}); fix it") from None


def _check_requirements(requirements: list, packages: list[LockedPackage], path: Path) -> None:
    """Every requirement is valid and satisfied by the lock's own package table (a cut lock is refused)."""
    locked = {p.name: p for p in packages}
    for line in requirements:
        try:
            requirement = Requirement(line) if isinstance(line, str) else None
        except InvalidRequirement as exc:
            requirement, why = None, str(exc)
        else:
            why = "not a string"
        if requirement is None:
            raise ProfileError(f"{path}: requirement {line!r} is invalid ({why})")
        if locked and requirement.marker is not None and not _marker_holds(requirement, line, path):
            continue
        package = locked.get(canonicalize_name(requirement.name))
        if locked and package is None:
            raise ProfileError(f"{path}: the requirement {line!r} has no [[package]] entry: the lock is incomplete "
                               f"(cut or edited); run `envkit lock --lock {path}` or restore the file")
        if package and not requirement.specifier.contains(package.version, prereleases=True):
            raise ProfileError(f"{path}: {package.name} {package.version} in [[package]] does not satisfy the "
                               f"requirement {line!r}; run `envkit lock --lock {path}`")


def parse(data: dict, path: Path) -> Profile:
    table = data.get("profile")
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: no [profile] table; see lockfiles/cpu.toml for the format")
    requirements = _require(table, "requirements", list, "[profile]", path)
    _check_requirements(requirements, [], path)  # syntax now; against the table before installing
    entries = data.get("package", [])
    if not isinstance(entries, list):
        raise ProfileError(f"{path}: `package` must be an array of tables ([[package]])")
    packages = [_package(entry, f"[[package]] #{index + 1}", path) for index, entry in enumerate(entries)]
    if len({p.name for p in packages}) != len(packages):
        raise ProfileError(f"{path}: a package appears twice in [[package]]; run `envkit lock --lock {path}`")
    return Profile(
        name=check_profile_name(_require(table, "name", str, "[profile]", path), f"{path}: [profile].name"),
        description=table.get("description", ""),
        python=_plain(table, "python", path, None) or _require(table, "python", str, "[profile]", path),
        torch_backend=_plain(table, "torch-backend", path, None),
        platform=_plain(table, "platform", path, DEFAULT_PLATFORM),
        requirements=tuple(requirements),
        generated_by=table.get("generated-by", ""),
        packages=tuple(sorted(packages, key=lambda p: p.name)),
        path=path,
        exclude_newer=_exclude_newer(table, path),
        **_role(table, path),
    )


def _exclude_newer(table: dict, path: Path) -> str | None:
    value = table.get("exclude-newer")
    if value is not None and (not isinstance(value, str) or not EXCLUDE_NEWER.fullmatch(value)):
        raise ProfileError(f"{path}: [profile].exclude-newer = {printable(repr(value))} is not a date or an RFC 3339 "
                           f"UTC time (2026-12-05 or 2026-12-05T00:00:00Z)")
    return value


ROLES = ("train", "serve")
ENGINES = ("transformers", "vllm", "sglang")


def _role(table: dict, path: Path) -> dict:
    role, engine = table.get("role", "train"), table.get("engine")
    if role not in ROLES:
        raise ProfileError(f"{path}: [profile].role must be one of {', '.join(ROLES)}, not {printable(repr(role))}")
    if (role == "serve") != (engine is not None) or (engine is not None and engine not in ENGINES):
        raise ProfileError(f"{path}: a serve profile names its engine ([profile].engine: {', '.join(ENGINES)}); "
                           f"a training profile names none")
    return {"role": role, "engine": engine}


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
    if profile.role != "train":
        lines += [f"role = {_toml_string(profile.role)}", f"engine = {_toml_string(profile.engine)}"]
    if profile.exclude_newer:
        lines.append(f"exclude-newer = {_toml_string(profile.exclude_newer)}")
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
