"""Doctor reports as a table grouped by status (colour on a terminal only) or as JSON."""

from __future__ import annotations

import json

import click

from envkit.doctor.findings import Report, Status

COLOURS = {Status.FAIL: "red", Status.WARN: "yellow", Status.OK: "green"}


def as_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2)


def as_table(report: Report, *, colour: bool, show_ok: bool = True) -> str:
    lines = [f"venv:    {report.venv}", f"profile: {report.profile or '(none)'}", ""]
    for status in (Status.FAIL, Status.WARN, Status.OK):
        group = [f for f in report.findings if f.status == status]
        if not group or (status == Status.OK and not show_ok):
            continue
        label = click.style(status.value.upper(), fg=COLOURS[status], bold=True) if colour else status.value.upper()
        lines.append(f"{label} ({len(group)})")
        width = max(len(f.id) for f in group)
        for finding in group:
            lines.append(f"  {finding.id:<{width}}  {finding.subject}: {finding.message}")
            if finding.fix and status != Status.OK:
                lines.append(f"  {'':<{width}}  fix: {finding.fix}")
        lines.append("")
    for skipped in report.skipped:
        lines.append(f"skipped: {skipped}")
    summary = report.summary
    lines.append(f"{summary['fail']} fail, {summary['warn']} warn, {summary['ok']} ok")
    return "\n".join(lines)
