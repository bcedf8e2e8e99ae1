"""The prompt file of a regeneration, read from one open descriptor: counted and hashed before anything is sent,
then read row by row, hashed again as it is consumed, so the sha256 the manifest records is that of the bytes
answered (a file written to while it was read is refused; rows appended during the run are not read)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from envkit.errors import RegenError

ROW_LIMIT = 64 << 20  # a prompt row is parsed whole


class PromptFile:
    def __init__(self, path: Path):
        self.path = path
        self.handle = None
        self.sha256 = ""
        self.size = self.rows = self.lines = 0
        self._consumed = hashlib.sha256()

    def __enter__(self) -> PromptFile:
        try:
            self.handle = self.path.open("rb")
        except OSError as exc:
            raise RegenError(f"--data {self.path}: {exc.strerror}") from None
        digest = hashlib.sha256()
        for _, line in self._lines(None):
            digest.update(line)
            self.size += len(line)
            self.lines += 1
            self.rows += bool(line.strip())
        self.sha256 = digest.hexdigest()
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()

    def _lines(self, limit: int | None):
        """(line number, bytes) from the handle's position, at most `limit` bytes in all (None: to the end)."""
        number, left = 0, limit
        while left is None or left > 0:
            line = self.handle.readline(ROW_LIMIT + 1 if left is None else min(ROW_LIMIT + 1, left))
            if not line:
                return
            number += 1
            if len(line) > ROW_LIMIT and not line.endswith(b"\n"):
                raise RegenError(f"{self.path}:{number}: a row over {ROW_LIMIT >> 20} MiB; split it")
            if left is not None:
                left -= len(line)
            yield number, line

    def rows_from(self, offset: int, line_number: int):
        """(line number, raw row, offset after it) of every non-blank line after the first `offset` bytes, which
        were settled by an earlier run (read and hashed here, not parsed)."""
        self.handle.seek(0)
        self._consumed = hashlib.sha256()
        remaining = offset
        while remaining:
            chunk = self.handle.read(min(remaining, 1 << 20))
            if not chunk:
                break
            self._consumed.update(chunk)
            remaining -= len(chunk)
        position = offset
        for number, line in self._lines(self.size - offset):
            self._consumed.update(line)
            position += len(line)
            if line.strip():
                yield line_number + number, line, position

    def check_unchanged(self) -> None:
        if self._consumed.hexdigest() != self.sha256:
            raise RegenError(f"--data {self.path} changed while it was read (the bytes answered are not the bytes "
                             f"hashed at the start); regenerate from a file nothing writes to")
