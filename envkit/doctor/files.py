"""Checks of files in site-packages: RECORD hashes (hand patches) and start-up .pth hooks."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
from concurrent.futures import ThreadPoolExecutor

from envkit.doctor import statindex
from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Status
from envkit.support.safeio import UnsafeFile, open_regular, read_bytes, read_text

# Suffixes checked by default: the files people patch by hand. --deep checks every file.
SOURCE_SUFFIXES = (".py", ".pth", ".json", ".txt", ".cfg", ".toml")
# .pth files that venv tools and setuptools install and that do nothing surprising.
STANDARD_PTH = {"distutils-precedence.pth", "_virtualenv.pth"}
PTH_LIMIT = 1 << 20


def _file_digest(path: str) -> tuple[str | None, list[int] | None]:
    """(RECORD-style digest, stat key) of a regular file, or (None, None) when it is missing, a link, a FIFO
    or a device: nothing a RECORD lists may hang doctor or point it elsewhere."""
    try:
        fd, info = open_regular(path)
    except UnsafeFile:
        return None, None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode(), statindex.stat_key(info)


def _inside(relative: str) -> bool:
    """A RECORD path that stays inside site-packages: relative, no '..' anywhere, no NUL."""
    if not relative or "\0" in relative or relative.startswith("/"):
        return False
    return ".." not in relative.replace("\\", "/").split("/")


def _record_summary(ctx: Context, dist) -> dict:
    """What the checks need of a RECORD: {"stat", "rows": [[relative, digest], ...] to check, "pth": the top-level
    .pth files it lists}; from the index when the RECORD's stat is unchanged, else parsed (paths as strings:
    pathlib costs more than the check itself on torch's ~20,000 rows)."""
    name = dist.dist_info.name
    if name in ctx.record_summaries:
        return ctx.record_summaries[name]
    key = statindex.current_stat_key(str(dist.record_path()))  # before the read: a later edit shows next run
    known = ctx.stat_index.records.get(name) if ctx.stat_index else None
    if key and isinstance(known, dict) and known.get("stat") == key and _well_formed(known):
        summary = known
    else:
        rows, pth = [], []
        for row in ctx.record_rows(dist):
            relative = row[0] if row else ""
            if relative.endswith(".pth") and "/" not in relative:
                pth.append(relative)
            if len(row) < 2 or not row[1].startswith("sha256=") or not _inside(relative):
                continue  # scripts outside site-packages are rewritten by the installer
            if ctx.deep or relative.endswith(SOURCE_SUFFIXES):
                rows.append([relative, row[1]])
        summary = {"stat": key if name not in ctx.record_problems else None, "rows": rows, "pth": pth}
    ctx.record_summaries[name] = summary
    return summary


def _well_formed(known: dict) -> bool:
    """An index entry as this module writes it (the index is envkit's, but a damaged one must not mislead)."""
    rows, pth = known.get("rows"), known.get("pth")
    return (isinstance(rows, list) and isinstance(pth, list) and all(isinstance(p, str) for p in pth)
            and all(type(r) is list and len(r) == 2 for r in rows))


def _unchanged(index: statindex.StatIndex, relative: str, path: str, expected: str) -> bool:
    """Verified before with this very stat: the content cannot have changed (see statindex)."""
    known = index.files.get(relative)
    return bool(known) and known[4] == expected and statindex.current_stat_key(path) == known[:4]


def _state(path: str, actual: str | None) -> str:
    if actual is not None:
        return "edited"
    if not os.path.lexists(path):
        return "missing"
    return "unsafe"  # a link, FIFO, socket or device where the RECORD lists a file


def modified_files(ctx: Context) -> list[tuple[str, str, str, str]]:
    """(distribution, path relative to site-packages, edited | missing | unsafe, RECORD digest) for every file
    that differs from its RECORD."""
    root, entries, records = str(ctx.site_packages), [], {}
    for name, dists in ctx.by_name.items():
        if len(dists) == 1:  # duplicates are reported as such; their RECORDs contradict each other
            summary = _record_summary(ctx, dists[0])
            records[dists[0].dist_info.name] = summary
            entries += [(name, relative, os.path.join(root, relative), digest) for relative, digest in summary["rows"]]
    index = ctx.stat_index or statindex.StatIndex()
    to_hash = [entry for entry in entries if not _unchanged(index, entry[1], entry[2], entry[3])]
    # hashlib releases the GIL, so threads hash files in parallel.
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as pool:
        hashed = list(pool.map(lambda entry: _file_digest(entry[2]), to_hash))
    ctx.files_checked, ctx.files_hashed = len(entries), len(to_hash)
    verified = dict(index.files)
    changed = []
    for (name, relative, path, expected), (actual, key) in zip(to_hash, hashed):
        if actual == expected:
            verified[relative] = [*key, expected]
        else:
            verified.pop(relative, None)
            changed.append((name, relative, _state(path, actual), expected))
    kept = {} if ctx.deep else {name: summary for name, summary in records.items() if summary["stat"]}
    if to_hash or kept != index.records:
        listed = {entry[1] for entry in entries}
        statindex.save(ctx.venv, statindex.StatIndex({r: v for r, v in verified.items() if r in listed}, kept))
    return changed


STATES = {"missing": "is missing", "edited": "differs from its RECORD hash (edited by hand?)",
          "unsafe": "is not a regular file (a link, FIFO or device) where its RECORD lists one; not read"}


def check_modified(ctx: Context) -> list[Finding]:
    """files.modified: installed files whose content no longer matches their RECORD hash."""
    findings = []
    for name, relative, state, expected in modified_files(ctx):
        message = STATES[state]
        if state == "edited" and (ctx.site_packages / relative).lstat().st_nlink > 1:
            message += "; it is hard-linked, so uv's cache copy was edited too (--fix cleans that entry)"
        findings.append(Finding("files.modified", Status.FAIL, relative, f"{relative} of {name} {message}",
                                ctx.fix_command(), _edit_diff(ctx, name, relative, expected) if state == "edited" else ""))
    for dist_info, why in ctx.record_problems.items():
        findings.append(Finding("files.modified", Status.FAIL, f"{dist_info}/RECORD",
                                f"{dist_info}/RECORD is unreadable ({why}): its files cannot be checked",
                                ctx.fix_command()))
    scope = "every file" if ctx.deep else "Python sources and text files (--deep: every file)"
    cached = f", {ctx.files_checked - ctx.files_hashed} unchanged since verified" if not ctx.deep else ""
    return findings or [Finding("files.modified", Status.OK, f"{ctx.files_checked} files",
                                f"all match their RECORD hashes; checked {scope}{cached}")]


def _edit_diff(ctx: Context, name: str, relative: str, expected: str) -> str:
    """The edit as a unified diff against the shipped file, or how to get one."""
    # Only an edited file needs the shipped original (zipfile, uv): not imported by a clean doctor.
    from envkit.doctor.original import original, unified_diff

    dist = ctx.by_name[name][0]
    shipped = original(dist, relative, expected, fetch=ctx.fetch, find_links=ctx.find_links)
    if shipped is None:
        return (f"no copy of {name} {dist.version} as shipped is on this machine (wheelhouse, uv cache); "
                f"`envkit doctor --fetch` downloads that wheel to show the edit")
    try:
        edited = read_bytes(ctx.site_packages / relative, 64 << 20)
    except UnsafeFile as exc:
        return f"the edited file cannot be shown ({exc})"
    return unified_diff(shipped, edited, relative)


def recorded_paths(ctx: Context) -> set[str]:
    """Every checked path (relative to site-packages) some distribution's RECORD lists."""
    return {relative for dist in ctx.distributions for relative, _digest in _record_summary(ctx, dist)["rows"]}


def pth_owners(ctx: Context) -> dict[str, str]:
    """Which distribution's RECORD lists each top-level .pth file."""
    return {pth: dist.name for dist in ctx.distributions for pth in _record_summary(ctx, dist)["pth"]}


def check_pth(ctx: Context) -> list[Finding]:
    """site.pth: .pth lines that add paths or run code at every interpreter start."""
    findings = []
    unusual = [pth for pth in sorted(ctx.site_packages.glob("*.pth")) if pth.name not in STANDARD_PTH]
    owners = pth_owners(ctx) if unusual else {}
    locked = {p.name for p in ctx.profile.packages} if ctx.profile else set()
    for pth in unusual:
        owner = owners.get(pth.name)
        if owner in locked:
            continue  # a locked package's own .pth (an editable install, say) is part of the lock
        fix = f"rm {shlex.quote(str(pth))}" if not owner else ctx.fix_command()
        try:
            lines = [line.strip() for line in read_text(pth, PTH_LIMIT).splitlines()]
        except UnsafeFile as exc:  # Python would still read it at every start: a link or special file is a fault
            findings.append(Finding("site.pth", Status.FAIL, pth.name, f"is {exc}; Python reads it at every start", fix))
            continue
        code = [line for line in lines if line.startswith(("import ", "import\t"))]
        added = [line for line in lines if line and not line.startswith("#") and line not in code]
        origin = f"installed by {owner}" if owner else "not installed by any package"
        if code:
            findings.append(Finding("site.pth", Status.FAIL, pth.name,
                                    f"runs code at every start ({origin}): {code[0][:80]}", fix))
        if added:
            findings.append(Finding("site.pth", Status.WARN, pth.name,
                                    f"adds {len(added)} path(s) to sys.path ({origin}): {added[0][:80]}", fix))
    return findings or [Finding("site.pth", Status.OK, "site-packages", "no .pth file adds paths or runs code")]
