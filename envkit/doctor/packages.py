"""Checks of the installed package set: against the lock, the stray catalog, and each other."""

from __future__ import annotations

import fnmatch
import functools
import shlex
import sys

from packaging.markers import InvalidMarker, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envkit import paths
from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Status
from envkit.venv.installed import invalid_dist_infos

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.cache
def stray_catalog() -> dict:
    return tomllib.loads(paths.data_file("strays.toml").read_text())


def check_lock(ctx: Context) -> list[Finding]:
    """lock.missing, lock.version and lock.extra: the installed set against the lock."""
    findings: list[Finding] = []
    fix = ctx.fix_command()
    for package in ctx.profile.packages:
        installed = ctx.by_name.get(package.name, [])
        if not installed:
            findings.append(Finding("lock.missing", Status.FAIL, package.name,
                                    f"{package.name} {package.version} is locked but not installed", fix))
            continue
        # Full versions, local labels included: 2.13.0+cpu is not 2.13.0 and not 2.14.1.
        versions = sorted({d.version for d in installed})
        if versions != [package.version]:
            findings.append(Finding("lock.version", Status.FAIL, package.name,
                                    f"installed {', '.join(versions)}, locked {package.version}", fix))
    locked = {p.name for p in ctx.profile.packages}
    strays = stray_reasons(ctx)
    for name in sorted(set(ctx.by_name) - locked - set(strays)):
        versions = ", ".join(d.version for d in ctx.by_name[name])
        findings.append(Finding("lock.extra", Status.WARN, name, f"{name} {versions} is installed but not in the lock", fix))
    if not findings:
        findings.append(Finding("lock.version", Status.OK, f"{len(locked)} packages",
                                f"installed set equals lock {ctx.profile.lock_digest[:12]}"))
    return findings


def _torch_cuda_major(ctx: Context) -> str | None:
    build = ctx.torch_build
    return build["cuda"].split(".")[0] if build and build["cuda"] else None


def stray_reasons(ctx: Context) -> dict[str, str]:
    """Installed catalog packages that the lock does not ask for, with why they are trouble."""
    locked = {p.name for p in ctx.profile.packages} if ctx.profile else set()
    catalog = stray_catalog()
    reasons = {entry["name"]: entry["why"] for entry in catalog.get("stray", [])}
    torch_major = _torch_cuda_major(ctx)
    found = {}
    for name in ctx.by_name:
        if name in locked:
            continue
        if name in reasons:
            found[name] = reasons[name]
            continue
        for pattern in catalog.get("pattern", []):
            if fnmatch.fnmatch(name, pattern["glob"]) and pattern["cuda-major"] != torch_major:
                torch_kind = f"CUDA {torch_major}" if torch_major else "CPU"
                found[name] = f"{pattern['why']} (torch here is a {torch_kind} build)"
    return found


def serve_profiles() -> dict[str, str]:
    """Catalog package -> the serve profile whose venv runs it (serving stacks belong in a venv of their own)."""
    return {entry["name"]: entry["serve-profile"] for entry in stray_catalog().get("stray", [])
            if "serve-profile" in entry}


def check_strays(ctx: Context) -> list[Finding]:
    findings = []
    serving = serve_profiles()
    for name, why in sorted(stray_reasons(ctx).items()):
        version = ", ".join(d.version for d in ctx.by_name[name])
        # `name` passed PEP 508's name rule (envkit/venv/installed.py); the path is quoted: the line is pasted into a shell.
        fix = ctx.fix_command() if ctx.profile else \
            f"uv pip uninstall --python {shlex.quote(str(ctx.venv.python))} {shlex.quote(name)}"
        if name in serving and ctx.role == "train":
            fix += (f"; then serve from a venv of its own: envkit create --profile {serving[name]} --venv .venv-serve "
                    f"&& envkit serve --venv .venv-serve --model DIR")
        findings.append(Finding("stray.known", Status.FAIL, name, f"{name} {version}: {why}", fix))
    return findings or [Finding("stray.known", Status.OK, "catalog", "no package known to break training envs")]


def check_invalid(ctx: Context) -> list[Finding]:
    """dist.invalid: a dist-info whose METADATA is missing, not a regular file, or names no valid package/version."""
    findings = [Finding("dist.invalid", Status.FAIL, name, f"{name} is not a valid distribution: {why}; installers "
                        f"and envkit cannot account for its files",
                        f"remove {shlex.quote(str(ctx.site_packages / name))} and reinstall what it belonged to")
                for name, why in invalid_dist_infos(ctx.site_packages).items()]
    return findings or [Finding("dist.invalid", Status.OK, "site-packages", "every dist-info names a valid package")]


def check_duplicates(ctx: Context) -> list[Finding]:
    findings = []
    for name, dists in sorted(ctx.by_name.items()):
        if len(dists) > 1:
            folders = ", ".join(d.dist_info.name for d in dists)
            findings.append(Finding("dist.duplicate", Status.FAIL, name,
                                    f"{len(dists)} dist-info folders ({folders}): a half-finished uninstall or swap; "
                                    f"which files belong to which is unknowable", ctx.fix_command() if ctx.profile else
                                    f"remove the stale folder, then reinstall {name}"))
    return findings or [Finding("dist.duplicate", Status.OK, "site-packages", "one dist-info per package")]


def _marker_env(ctx: Context) -> dict[str, str]:
    version = ctx.python_version
    return {"python_version": ".".join(version.split(".")[:2]), "python_full_version": version, "extra": ""}


def check_requires(ctx: Context) -> list[Finding]:
    """dist.requires: what `pip check` reports, from metadata alone."""
    findings = []
    env = _marker_env(ctx)
    installed = {name: dists[0].version for name, dists in ctx.by_name.items()}
    for dist in ctx.distributions:
        for line in dist.requires:
            if "extra" in line.partition(";")[2]:
                continue  # an optional extra's requirement (`; extra == "dev"`): nothing asks for it; parsing is slow
            try:
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
            except (InvalidRequirement, InvalidMarker, UndefinedEnvironmentName):
                continue
            name = canonicalize_name(req.name)
            have = installed.get(name)
            if have is None:
                problem = f"requires {req}, which is not installed"
            else:
                try:
                    if not req.specifier or req.specifier.contains(Version(have), prereleases=True):
                        continue
                except InvalidVersion:
                    continue
                problem = f"requires {req}, but {name} {have} is installed"
            findings.append(Finding("dist.requires", Status.FAIL, dist.name, f"{dist.name} {dist.version} {problem}",
                                    ctx.fix_command() if ctx.profile else f"install {req}", related=name))
    return findings or [Finding("dist.requires", Status.OK, "site-packages", "every requirement is met")]
