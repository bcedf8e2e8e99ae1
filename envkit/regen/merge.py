"""A change to OUT, its errors file and its manifest together, with one commit point (`--retry-failed`'s merge).

The three new files are written beside their targets as staged copies and fsynced; then a journal naming each
staged file and its sha256 is written atomically: that write is the commit. After it, the staged files are renamed
over their targets and the journal removed. A run that finds the journal (a kill after the commit) finishes the
renames, each checked against its recorded sha256; one that finds staged files but no journal (a kill before the
commit) removes them, leaving the files as they were. So after a kill at any instant the three files are all old or
all new, and the next regenerate of OUT (which holds OUT's lock while it looks) makes it so.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from envkit.errors import RegenError
from envkit.support.fsops import write_json_atomic
from envkit.support.trainer_helpers import file_sha256, read_json_file

STAGED = ".merge-staged"


def journal_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.merge-journal.json")


def staged(target: Path) -> Path:
    return target.with_name(f".{target.name}{STAGED}")


def commit(out: Path, targets: list[Path]) -> None:
    """Make the staged copy of each target (already written and fsynced) the target, all or none."""
    journal = {"files": {target.name: file_sha256(staged(target)) for target in targets}}
    _killed_here("before-commit")
    write_json_atomic(journal_path(out), journal, mode=0o600)  # the commit point
    _killed_here("after-commit")
    _roll_forward(out, journal)


def recover(out: Path) -> str | None:
    """Finish a committed merge or undo one that never committed; what was done ("finished", "undone"), or None.
    The caller holds OUT's lock."""
    journal_file = journal_path(out)
    if journal_file.exists():
        try:
            journal = read_json_file(journal_file, limit=1 << 20)
        except ValueError:
            journal = None
        if not (isinstance(journal, dict) and isinstance(journal.get("files"), dict)):
            raise RegenError(f"{journal_file} is not a merge journal regenerate wrote; remove it and start over")
        _roll_forward(out, journal)
        return "finished"
    leftovers = [path for path in out.parent.glob(f".{out.name}*{STAGED}")]
    for path in leftovers:
        path.unlink()
    return "undone" if leftovers else None


def _roll_forward(out: Path, journal: dict) -> None:
    for name, digest in journal["files"].items():
        target = out.with_name(name)
        if staged(target).exists():
            if file_sha256(staged(target)) != digest:
                raise RegenError(f"{staged(target)} is not the file the merge committed; remove "
                                 f"{journal_path(out).name} and the staged files, and start over")
            os.replace(staged(target), target)
            _killed_here("mid-rename")
        elif not target.exists() or file_sha256(target) != digest:
            raise RegenError(f"{target} is neither the merged file nor its staged copy; start over")
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames durable before the journal goes
    finally:
        os.close(fd)
    journal_path(out).unlink()


def _killed_here(instant: str) -> None:
    """The tests' SIGKILL at one instant of the merge (ENVKIT_TEST_KILL_MERGE=instant), as a kill would land."""
    if os.environ.get("ENVKIT_TEST_KILL_MERGE") == instant:
        os.kill(os.getpid(), signal.SIGKILL)


def dumps(record: dict) -> str:
    return json.dumps(record, indent=2, sort_keys=True) + "\n"
