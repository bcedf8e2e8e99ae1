"""What doctor reports: findings with a stable id, a status, a subject, a message and a fix."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    id: str  # stable check id, e.g. "lock.version"
    status: Status
    subject: str  # the package, file, path or variable concerned
    message: str
    fix: str = ""  # the command (or action) that repairs it
    detail: str = ""  # evidence beyond one line: the unified diff of a hand edit
    # The other package a finding names (dist.requires: the one required), as data: the doctor's story
    # groups findings by it, never by reading the message.
    related: str = ""

    def as_dict(self) -> dict:
        return {"id": self.id, "status": self.status.value, "subject": self.subject,
                "message": self.message, "fix": self.fix, "detail": self.detail, "related": self.related}


@dataclass(frozen=True)
class Report:
    venv: str
    profile: str | None
    findings: tuple[Finding, ...]
    skipped: tuple[str, ...] = field(default=())  # checks that could not run, with why
    causes: tuple = field(default=())  # story.Cause: every non-ok finding under the event that explains it
    history: tuple = field(default=())  # story.Event: what was installed, replaced, removed, edited since creation

    def count(self, status: Status) -> int:
        return sum(1 for f in self.findings if f.status == status)

    @property
    def summary(self) -> dict[str, int]:
        return {s.value: self.count(s) for s in Status}

    def failed(self, *, strict: bool = False) -> bool:
        return self.count(Status.FAIL) > 0 or (strict and self.count(Status.WARN) > 0)

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {"venv": self.venv, "profile": self.profile, "findings": [f.as_dict() for f in self.findings],
                "causes": [asdict(c) for c in self.causes], "history": [asdict(e) for e in self.history],
                "skipped": list(self.skipped), "summary": self.summary}
