"""Checks of files in site-packages: RECORD hashes (hand patches) and start-up .pth hooks."""

from __future__ import annotations

import base64
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Status

# Suffixes checked by default: the files people patch by hand. --deep checks every file.
SOURCE_SUFFIXES = (".py", ".pth", ".json", ".txt", ".cfg", ".toml")
# .pth files that venv tools and setuptools install and that do nothing surprising.
STANDARD_PTH = {"distutils-precedence.pth", "_virtualenv.pth"}


def _file_digest(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _record_entries(ctx: Context, dist) -> list[tuple[str, Path, str]]:
    entries = []
    for row in ctx.record_rows(dist):
        if len(row) < 2 or not row[1].startswith("sha256="):
            continue
        relative = row[0]
        if relative.startswith("..") or os.path.isabs(relative):
            continue  # scripts outside site-packages are rewritten by the installer
        if not ctx.deep and not relative.endswith(SOURCE_SUFFIXES):
            continue
        entries.append((relative, ctx.site_packages / relative, row[1]))
    return entries


def modified_files(ctx: Context) -> list[tuple[str, str, bool, str]]:
    """(distribution, path relative to site-packages, missing?, RECORD digest) for files that differ from RECORD."""
    entries = []
    for name, dists in ctx.by_name.items():
        if len(dists) == 1:  # duplicates are reported as such; their RECORDs contradict each other
            entries += [(name, *entry) for entry in _record_entries(ctx, dists[0])]
    # hashlib releases the GIL, so threads hash files in parallel.
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as pool:
        digests = list(pool.map(lambda entry: _file_digest(entry[2]), entries, chunksize=64))
    ctx.files_checked = len(entries)
    return [(name, relative, actual is None, expected)
            for (name, relative, _path, expected), actual in zip(entries, digests) if actual != expected]


def check_modified(ctx: Context) -> list[Finding]:
    """files.modified: installed files whose content no longer matches their RECORD hash."""
    findings = []
    for name, relative, missing, expected in modified_files(ctx):
        state = "is missing" if missing else "differs from its RECORD hash (edited by hand?)"
        if not missing and (ctx.site_packages / relative).stat().st_nlink > 1:
            state += "; it is hard-linked, so uv's cache copy was edited too (--fix cleans that entry)"
        findings.append(Finding("files.modified", Status.FAIL, relative, f"{relative} of {name} {state}",
                                ctx.fix_command(), "" if missing else _edit_diff(ctx, name, relative, expected)))
    scope = "every file" if ctx.deep else "Python sources and text files (--deep: every file)"
    return findings or [Finding("files.modified", Status.OK, f"{ctx.files_checked} files",
                                f"all match their RECORD hashes; checked {scope}")]


def _edit_diff(ctx: Context, name: str, relative: str, expected: str) -> str:
    """The edit as a unified diff against the shipped file, or how to get one."""
    from envkit.doctor.original import original, unified_diff

    dist = ctx.by_name[name][0]
    shipped = original(dist, relative, expected, fetch=ctx.fetch, find_links=ctx.find_links)
    if shipped is None:
        return (f"no copy of {name} {dist.version} as shipped is on this machine (wheelhouse, uv cache); "
                f"`envkit doctor --fetch` downloads that wheel to show the edit")
    return unified_diff(shipped, (ctx.site_packages / relative).read_bytes(), relative)


def pth_owners(ctx: Context) -> dict[str, str]:
    """Which distribution's RECORD lists each top-level .pth file."""
    owners = {}
    for dist in ctx.distributions:
        for row in ctx.record_rows(dist):
            path = row[0] if row else ""
            if path.endswith(".pth") and "/" not in path:
                owners[path] = dist.name
    return owners


def check_pth(ctx: Context) -> list[Finding]:
    """site.pth: .pth lines that add paths or run code at every interpreter start."""
    findings = []
    owners = pth_owners(ctx)
    locked = {p.name for p in ctx.profile.packages} if ctx.profile else set()
    for pth in sorted(ctx.site_packages.glob("*.pth")):
        owner = owners.get(pth.name)
        if pth.name in STANDARD_PTH or owner in locked:
            continue  # a locked package's own .pth (an editable install, say) is part of the lock
        lines = [line.strip() for line in pth.read_text(errors="replace").splitlines()]
        code = [line for line in lines if line.startswith(("import ", "import\t"))]
        added = [line for line in lines if line and not line.startswith("#") and line not in code]
        origin = f"installed by {owner}" if owner else "not installed by any package"
        fix = f"rm {pth}" if not owner else ctx.fix_command()
        if code:
            findings.append(Finding("site.pth", Status.FAIL, pth.name,
                                    f"runs code at every start ({origin}): {code[0][:80]}", fix))
        if added:
            findings.append(Finding("site.pth", Status.WARN, pth.name,
                                    f"adds {len(added)} path(s) to sys.path ({origin}): {added[0][:80]}", fix))
    return findings or [Finding("site.pth", Status.OK, "site-packages", "no .pth file adds paths or runs code")]
