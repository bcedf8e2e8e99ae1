"""What happened to a venv: its install history since envkit made it, and the causes behind the findings.

History comes from what installers leave in each dist-info (INSTALLER names the tool, REQUESTED
marks what a person asked for, the directory's time says when) and from envkit.json's creation
time. Causes fold every non-ok finding under the one event that explains it: a package installed
or replaced after creation (its drift, stray status, unmet requirements, build mismatch and the
hazards it brings), a package removed, a file edited by hand, a stray dist-info, a .pth, a variable,
the compile cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from envkit.doctor.context import Context
from envkit.doctor.findings import Report, Status
from envkit.support.safeio import UnsafeFile, read_text

SLACK_S = 2.0  # dist-infos written by the create itself land within its last seconds


@dataclass(frozen=True)
class Event:
    action: str  # installed | replaced | removed | edited | added | duplicated
    subject: str  # a package name or a file
    detail: str
    when: str | None  # ISO time, None when nothing on disk says
    installer: str  # uv, pip, conda, ... or "by hand"
    requested: bool | None = None  # a person asked for it (REQUESTED), or it came as a dependency


@dataclass
class Cause:
    id: str
    summary: str
    findings: list[int] = field(default_factory=list)
    when: str | None = None
    installer: str | None = None
    fix: str = ""


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="seconds")


def _created(ctx: Context) -> float | None:
    try:
        manifest = ctx.venv.manifest() or {}
        return datetime.fromisoformat(manifest["created_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def _installer(dist_info) -> str:
    try:  # not followed, not blocking: a FIFO named INSTALLER must not hang doctor
        return read_text(dist_info / "INSTALLER", 4096).strip()[:40] or "by hand"
    except UnsafeFile:
        return "by hand"  # no installer wrote this dist-info


def history(ctx: Context) -> list[Event]:
    """Changes since envkit created the venv, oldest first (events without a time last)."""
    created = _created(ctx)
    locked = {p.name: p.version for p in ctx.profile.packages} if ctx.profile else {}
    events: list[tuple[float, Event]] = []
    for name, dists in ctx.by_name.items():
        for index, dist in enumerate(sorted(dists, key=lambda d: d.dist_info.stat().st_mtime)):
            when = dist.dist_info.stat().st_mtime
            if created is not None and when <= created + SLACK_S and name in locked:
                continue  # part of the create
            if index < len(dists) - 1:
                action, detail = "duplicated", f"{name} {dist.version}: a second dist-info left behind"
            elif name in locked and dist.version != locked[name]:
                action, detail = "replaced", f"{name} {locked[name]} replaced by {dist.version}"
            elif name in locked:
                action, detail = "reinstalled", f"{name} {dist.version} reinstalled"
            else:
                action, detail = "installed", f"{name} {dist.version} installed"
            events.append((when, Event(action, name, detail, _iso(when), _installer(dist.dist_info),
                                       (dist.dist_info / "REQUESTED").exists())))
    for name, version in locked.items():
        if name not in ctx.by_name:
            events.append((float("inf"), Event("removed", name, f"{name} {version} removed", None, "unknown")))
    return [event for _, event in sorted(events, key=lambda pair: pair[0])]


def causes(ctx: Context, report: Report, events: list[Event]) -> list[Cause]:
    """Every non-ok finding under exactly one cause, the causes in the order their events happened."""
    changed = {e.subject: e for e in events if e.action in ("installed", "replaced", "reinstalled")}
    removed = {e.subject: e for e in events if e.action == "removed"}
    grouped: dict[str, Cause] = {}

    def cause_for(key: str, summary: str, event: Event | None = None, fix: str = "") -> Cause:
        if key not in grouped:
            grouped[key] = Cause(key, summary, when=event.when if event else None,
                                 installer=event.installer if event else None, fix=fix)
        return grouped[key]

    def package(name: str) -> Cause:
        event = changed.get(name)
        how = f" ({event.installer}{', asked for' if event.requested else ', as a dependency'})" if event else ""
        return cause_for(f"package:{name}", (event.detail if event else f"{name} differs from the lock") + how,
                         event, ctx.fix_command())

    duplicated = {f.subject for f in report.findings if f.id == "dist.duplicate" and f.status != Status.OK}
    for index, finding in enumerate(report.findings):
        if finding.status == Status.OK:
            continue
        fid, subject = finding.id, finding.subject
        if fid in ("lock.version", "dist.duplicate") and subject in duplicated:  # the stale copy is the drift
            cause = cause_for(f"duplicate:{subject}", f"a stale second dist-info of {subject}", fix=finding.fix)
        elif fid in ("lock.version", "lock.extra", "stray.known"):
            cause = package(subject)
        elif fid == "lock.missing":
            cause = cause_for(f"removed:{subject}", removed[subject].detail if subject in removed else
                              f"{subject} removed", removed.get(subject), ctx.fix_command())
        elif fid == "dist.requires":
            name = finding.related
            if subject in changed:
                cause = package(subject)
            elif name in changed:
                cause = package(name)
            elif name in removed:
                cause = cause_for(f"removed:{name}", removed[name].detail, removed[name], ctx.fix_command())
            else:
                cause = cause_for(f"requires:{subject}", f"{subject} has unmet requirements", fix=finding.fix)
        elif fid in ("torch.build", "torch.hazard") and ("torch" in changed or "triton" in changed):
            cause = package("torch" if "torch" in changed else "triton")
        elif fid == "files.modified":
            path = ctx.site_packages / subject
            edited = Event("edited", subject, "", _iso(path.stat().st_mtime), "by hand") if path.exists() else None
            cause = cause_for(f"edit:{subject}", f"{subject} edited by hand", edited, finding.fix)
        elif fid == "site.pth":
            cause = cause_for(f"pth:{subject}", f"{subject} added to site-packages (runs at every start)",
                              fix=finding.fix)
        elif fid == "env.leak":
            cause = cause_for(f"env:{subject}", f"{subject} set in the environment", fix=finding.fix)
        elif fid == "torch.hazard" and finding.status == Status.WARN:
            cause = cause_for("selftest", "the trainer's hazard mitigations are not verified in this venv yet",
                              fix=finding.fix)
        elif fid == "torch.hazard":
            cause = cause_for("selftest-failed", "the trainer's hazard mitigations failed their self-tests",
                              fix=finding.fix)
        elif fid.startswith("cache."):
            cause = cause_for("cache", "the compile cache is untrusted or cold", fix=finding.fix)
        else:
            cause = cause_for(f"{fid}:{subject}", f"{fid}: {subject}", fix=finding.fix)
        cause.findings.append(index)
    for cause in grouped.values():
        counts = {}
        for index in cause.findings:
            fid = report.findings[index].id
            counts[fid] = counts.get(fid, 0) + 1
        cause.summary += ": " + ", ".join(f"{n} {fid}" for fid, n in counts.items())
    order = {e.subject: i for i, e in enumerate(events)}
    return sorted(grouped.values(), key=lambda c: order.get(c.id.split(":", 1)[-1], len(order)))


def as_dicts(items) -> list[dict]:
    return [asdict(item) for item in items]
