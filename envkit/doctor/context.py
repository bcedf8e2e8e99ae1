"""What every check reads: the venv, its installed distributions, the lock (if any), the environment."""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from envkit.installed import Distribution, installed_distributions
from envkit.profile import Profile
from envkit.venv import Venv


@dataclass
class Context:
    venv: Venv
    profile: Profile | None
    environ: dict[str, str]
    deep: bool = False
    fetch: bool = False  # download a wheel to show a hand edit as a diff
    find_links: tuple = ()  # wheelhouses given on the command line (the configured ones are read too)
    files_checked: int = 0  # set by the RECORD check, for its summary line
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
        """A distribution's RECORD as CSV rows, read once per run ([] when unreadable)."""
        if dist.dist_info not in self._records:
            try:
                with dist.record_path().open(newline="") as handle:
                    self._records[dist.dist_info] = list(csv.reader(handle))
            except OSError:
                self._records[dist.dist_info] = []
        return self._records[dist.dist_info]

    @functools.cached_property
    def python_version(self) -> str:
        return self.venv.python_version()

    @functools.cached_property
    def torch_build(self) -> dict[str, str | None] | None:
        """torch/version.py read as text: {'version': '2.13.0+cpu', 'cuda': None or '13.0'}."""
        path = self.site_packages / "torch" / "version.py"
        try:
            text = path.read_text()
        except OSError:
            return None
        version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
        cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
        return {"version": version[1] if version else None, "cuda": cuda[1] if cuda else None}

    def fix_command(self) -> str:
        return f"envkit doctor --fix --venv {self.venv.path}"

    def torch_source(self, relative: str) -> str | None:
        try:
            return (self.site_packages / "torch" / relative).read_text(errors="replace")
        except OSError:
            return None
