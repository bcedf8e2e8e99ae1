"""What every check reads: the venv, its installed distributions, the lock (if any), the environment."""

from __future__ import annotations

import csv
import functools
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from envkit.doctor import statindex
from envkit.venv.installed import Distribution, installed_distributions
from envkit.lock.profile import Profile
from envkit.support.safeio import UnsafeFile, read_text
from envkit.venv.managed import Venv


RECORD_LIMIT = 64 << 20  # torch's RECORD is about 2 MB


@dataclass
class Context:
    venv: Venv
    profile: Profile | None
    environ: dict[str, str]
    deep: bool = False
    fetch: bool = False  # download a wheel to show a hand edit as a diff
    find_links: tuple = ()  # wheelhouses given on the command line (the configured ones are read too)
    lock_refused: str = ""  # why the lock the venv's envkit.json names was not used (venvrecord)
    role: str = "train"  # "serve": a serving engine's venv (venvrecord.role_of); its engine is expected, not a stray
    files_checked: int = 0  # set by the RECORD check, for its summary line
    files_hashed: int = 0  # of those, how many were read (the others' stat matched the doctor index)
    record_problems: dict = field(default_factory=dict)  # dist-info name -> why its RECORD is unreadable
    # dist-info name -> what the RECORD checks need of it (envkit.doctor.files)
    record_summaries: dict = field(default_factory=dict, repr=False)
    _records: dict = field(default_factory=dict, repr=False)  # dist-info path -> RECORD rows

    @functools.cached_property
    def site_packages(self) -> Path:
        return self.venv.site_packages()

    @functools.cached_property
    def distributions(self) -> list[Distribution]:
        return installed_distributions(self.site_packages)

    @functools.cached_property
    def by_name(self) -> dict[str, list[Distribution]]:
        grouped: dict[str, list[Distribution]] = {}
        for dist in self.distributions:
            grouped.setdefault(dist.name, []).append(dist)
        return grouped

    def record_rows(self, dist: Distribution) -> list[list[str]]:
        """A distribution's RECORD as CSV rows, read once per run ([] when unreadable; `record_problems` says why)."""
        if dist.dist_info not in self._records:
            try:
                text = read_text(dist.record_path(), RECORD_LIMIT)
                self._records[dist.dist_info] = list(csv.reader(io.StringIO(text, newline="")))
            except (UnsafeFile, csv.Error) as exc:  # csv.Error: a field over csv's 128 KiB limit, a NUL
                self._records[dist.dist_info] = []
                self.record_problems[dist.dist_info.name] = str(exc)
        return self._records[dist.dist_info]

    def forget(self, dist: Distribution) -> None:
        """A dist-info removed during this run owns no files any more."""
        self._records.pop(dist.dist_info, None)
        self.record_summaries.pop(dist.dist_info.name, None)

    @functools.cached_property
    def stat_index(self):
        """doctor's stat index of this venv (None with --deep, which hashes everything)."""
        return None if self.deep else statindex.load(self.venv)

    @functools.cached_property
    def python_version(self) -> str:
        return self.venv.python_version()

    @functools.cached_property
    def torch_build(self) -> dict[str, str | None] | None:
        """torch/version.py read as text: {'version': '2.13.0+cpu', 'cuda': None or '13.0'}."""
        path = self.site_packages / "torch" / "version.py"
        try:
            text = read_text(path, 1 << 20)
        except UnsafeFile:
            return None
        version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
        cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
        return {"version": version[1] if version else None, "cuda": cuda[1] if cuda else None}

    def lock_fix_command(self) -> str:
        return f"envkit doctor --venv {shlex.quote(str(self.venv.path))} --lock PATH  (or --profile NAME)"

    def fix_command(self) -> str:
        return f"envkit doctor --fix --venv {shlex.quote(str(self.venv.path))}"

    def torch_source(self, relative: str) -> str | None:
        try:
            return read_text(self.site_packages / "torch" / relative, 16 << 20)
        except UnsafeFile:
            return None
