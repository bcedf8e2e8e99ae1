"""Doctor reports as a table grouped by status (colour on a terminal only) or as JSON."""

from __future__ import annotations

import json

import click

from envkit.doctor.findings import Report, Status
from envkit.support.text import printable as safe

COLOURS = {Status.FAIL: "red", Status.WARN: "yellow", Status.OK: "green"}


def as_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2)


def _worst(report: Report, cause) -> Status:
    statuses = {report.findings[i].status for i in cause.findings}
    return Status.FAIL if Status.FAIL in statuses else Status.WARN


def as_story(report: Report, *, colour: bool, verbose: bool = False) -> str:
    """Causes first, one line each with the findings folded under them (-v unfolds); the fix once."""
    if not report.causes:
        return as_table(report, colour=colour, show_ok=verbose)
    lines = [f"venv:    {safe(report.venv)}", f"profile: {safe(report.profile or '(none)')}", "",
             f"what happened ({len(report.causes)} causes):"]
    fixes: dict[str, list[int]] = {}
    for number, cause in enumerate(report.causes, 1):
        status = _worst(report, cause)
        label = click.style(status.value.upper(), fg=COLOURS[status], bold=True) if colour else status.value.upper()
        when = f" [{safe(cause.when)}]" if cause.when else ""
        lines.append(f"  {number}. {label} {safe(cause.summary)}{when}")
        for index in cause.findings:
            finding = report.findings[index]
            if verbose:
                lines.append(f"         {finding.id}  {safe(finding.subject)}: {safe(finding.message)}")
            if finding.detail:  # the evidence of an edit is worth its lines
                lines += [f"         {safe(line)}" for line in finding.detail.splitlines()]
        if cause.fix:
            fixes.setdefault(cause.fix, []).append(number)
    lines.append("")
    for fix, numbers in fixes.items():  # each fix once, with the causes it repairs
        which = "all" if len(numbers) == len(report.causes) else ", ".join(map(str, numbers))
        lines.append(f"fix ({which}): {safe(fix)}")
    for skipped in report.skipped:
        lines.append(f"skipped: {safe(skipped)}")
    summary = report.summary
    hint = "" if verbose else "; -v lists every finding under its cause, --history when each change happened"
    lines.append(f"{summary['fail']} fail, {summary['warn']} warn, {summary['ok']} ok{hint}")
    return "\n".join(lines)


def as_history(report: Report) -> str:
    if not report.history:
        return "no change since envkit created this venv"
    lines = []
    for event in report.history:
        asked = {True: "asked for", False: "as a dependency", None: ""}[event.requested]
        lines.append(f"{safe(event.when or '(time unknown)'):25} {event.action:11} {safe(event.detail):50} "
                     f"{safe(event.installer)}{', ' + asked if asked else ''}")
    return "\n".join(lines)


def as_table(report: Report, *, colour: bool, show_ok: bool = True) -> str:
    lines = [f"venv:    {safe(report.venv)}", f"profile: {safe(report.profile or '(none)')}", ""]
    for status in (Status.FAIL, Status.WARN, Status.OK):
        group = [f for f in report.findings if f.status == status]
        if not group or (status == Status.OK and not show_ok):
            continue
        label = click.style(status.value.upper(), fg=COLOURS[status], bold=True) if colour else status.value.upper()
        lines.append(f"{label} ({len(group)})")
        width = max(len(f.id) for f in group)
        for finding in group:
            lines.append(f"  {finding.id:<{width}}  {safe(finding.subject)}: {safe(finding.message)}")
            if finding.fix and status != Status.OK:
                lines.append(f"  {'':<{width}}  fix: {safe(finding.fix)}")
        lines.append("")
    for skipped in report.skipped:
        lines.append(f"skipped: {safe(skipped)}")
    summary = report.summary
    lines.append(f"{summary['fail']} fail, {summary['warn']} warn, {summary['ok']} ok")
    return "\n".join(lines)
