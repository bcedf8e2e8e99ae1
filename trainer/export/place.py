"""Where an export goes: --out checked before any work (a real path, in an existing dir, empty, or with --force an
export envkit wrote that nobody changed since), and the finished export renamed into place. Torch-free, so a refused
--out is refused before the trainer imports torch or reads the checkpoint."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.common.files import file_sha256, read_json_record
from trainer.common.records import EXPORT_MANIFEST


def not_replaceable(out: Path) -> str | None:
    """Why `out` is not an export envkit wrote and nobody changed since, or None: its manifest must parse, and
    every entry in it must be a regular file the manifest lists with the sha256 it recorded (a file a user
    added or edited by hand is theirs: --force never deletes it)."""
    manifest = read_json_record(out / EXPORT_MANIFEST)
    files = manifest.get("files") if manifest else None
    if not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        return f"it has no readable {EXPORT_MANIFEST}: not an export made by envkit"
    for directory, dirnames, filenames in os.walk(out):
        for name in filenames + [d for d in dirnames if (Path(directory) / d).is_symlink()]:
            path = Path(directory) / name
            relative = str(path.relative_to(out))
            if relative == EXPORT_MANIFEST:
                continue
            if relative not in files:
                return f"it holds {relative!r}, which its {EXPORT_MANIFEST} does not list"
            if not stat.S_ISREG(path.lstat().st_mode):
                return f"{relative!r} is not a regular file"
            if file_sha256(path) != files[relative]:
                return f"{relative!r} was changed since the export (its sha256 differs from the recorded one)"
    return None


def place(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished export into place; --force swaps out a previous export only, and only when it holds
    nothing but the files its manifest lists."""
    if not out.exists():
        os.replace(tmp, out)
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        out.rmdir()
        os.replace(tmp, out)
        return
    check_out(out, force)
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def check_out(out: Path, force: bool) -> None:
    """--out before any work: a real path (no link), in an existing dir, empty or (with --force) an export."""
    if out.is_symlink():
        raise TrainerInputError(f"--out {out} is a symlink; give the real path of the directory to write")
    if not out.parent.is_dir():
        raise TrainerInputError(f"{out.parent} does not exist; create it first or choose another --out")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not force:
        raise TrainerInputError(f"{out} exists and is not empty; choose another --out or pass --force to replace "
                                f"a previous export")
    problem = "it is not a directory" if not out.is_dir() else not_replaceable(out)
    if problem:
        raise TrainerInputError(f"{str(out)!r} cannot be replaced, even with --force: {problem}; nothing was "
                                f"changed: choose another --out, or move your files out of it")
