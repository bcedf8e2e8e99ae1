"""Code that runs at every interpreter start without being in any RECORD: the interpreter itself, a decoy
site-packages, and sitecustomize/usercustomize modules.

doctor reads one site-packages (the one for the Python version pyvenv.cfg names). These checks make sure
that is the one the venv's interpreter loads, that `bin/python` is the interpreter pyvenv.cfg's `home`
names (not a script, not another binary), and that nothing Python imports on its own at start-up sits in
site-packages unless a distribution's RECORD lists it (files.modified then checks its hash).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
from pathlib import Path

from envkit.doctor.context import Context
from envkit.doctor.files import recorded_paths
from envkit.doctor.findings import Finding, Status
from envkit.support.safeio import UnsafeFile, open_regular, read_bytes
from envkit.support.text import printable
from envkit.venv.managed import Venv

# Modules the site module imports by itself at every start (a .pth's `import` lines are site.pth's).
STARTUP_MODULES = ("sitecustomize", "usercustomize")
INTERPRETER_NAMES = ("python", "python3")
ELF_MAGIC = b"\x7fELF"


def _rebuild(ctx: Context) -> str:
    return f"envkit create --force --venv {shlex.quote(str(ctx.venv.path))}"


def _same_file_digest(a: Path, b: Path) -> bool:
    try:
        return hashlib.sha256(read_bytes(a, 1 << 30)).digest() == hashlib.sha256(read_bytes(b, 1 << 30)).digest()
    except UnsafeFile:
        return False


def interpreter_problem(venv: Venv, launcher: Path) -> str | None:
    """Why `bin/NAME` is not the interpreter pyvenv.cfg's `home` names, or None."""
    home = venv.pyvenv_cfg().get("home")
    if not home or not os.path.isabs(home):
        return "pyvenv.cfg names no absolute `home`, so no interpreter can be vouched for"
    try:
        info = launcher.lstat()
    except OSError:
        return "missing"
    real = Path(os.path.realpath(launcher))
    try:
        fd, _ = open_regular(real)
        with os.fdopen(fd, "rb") as handle:
            head = handle.read(4)
    except UnsafeFile as exc:
        return f"resolves to {printable(real)}, which is {exc}"
    if head[:2] == b"#!":
        return f"is a script ({printable(real)}), not an interpreter: it runs whatever it names"
    if head != ELF_MAGIC:
        return f"{printable(real)} is not an executable binary"
    home_real = Path(os.path.realpath(home))
    candidates = [home_real / name for name in os.listdir(home_real)
                  if name.startswith("python")] if home_real.is_dir() else []
    if stat.S_ISLNK(info.st_mode):
        if any(os.path.realpath(c) == str(real) for c in candidates):
            return None
        return f"links to {printable(real)}, not to an interpreter in pyvenv.cfg's home {printable(home)}"
    # A copied interpreter (venv --copies): byte for byte one of home's.
    if any(_same_file_digest(launcher, Path(os.path.realpath(c))) for c in candidates):
        return None
    return f"is a binary that is not any interpreter in pyvenv.cfg's home {printable(home)}"


def check_interpreter(ctx: Context) -> list[Finding]:
    """venv.interpreter: bin/python (and python3, python3.X) are the interpreter pyvenv.cfg names."""
    version = ".".join(ctx.python_version.split(".")[:2])
    names = (*INTERPRETER_NAMES, f"python{version}")
    findings = []
    for name in names:
        launcher = ctx.venv.path / "bin" / name
        if name != "python" and not os.path.lexists(launcher):
            continue  # only bin/python is required; the others must be right when present
        problem = interpreter_problem(ctx.venv, launcher)
        if problem:
            findings.append(Finding("venv.interpreter", Status.FAIL, f"bin/{name}",
                                    f"bin/{name} {problem}; envkit runs the trainer with it", _rebuild(ctx)))
    return findings or [Finding("venv.interpreter", Status.OK, "bin/python",
                                f"is the interpreter pyvenv.cfg's home names (Python {ctx.python_version})")]


def check_site_packages(ctx: Context) -> list[Finding]:
    """venv.site-packages: no other site-packages beside the one the interpreter's version loads."""
    ours = os.path.realpath(ctx.site_packages)
    extra = [path for path in ctx.venv.all_site_packages() if os.path.realpath(path) != ours]
    findings = [Finding("venv.site-packages", Status.FAIL, str(path.relative_to(ctx.venv.path)),
                        f"{printable(path.relative_to(ctx.venv.path))} is a second site-packages beside "
                        f"{ctx.site_packages.relative_to(ctx.venv.path)} (the one Python {ctx.python_version} loads "
                        f"and doctor checks); what is installed there is unchecked",
                        f"rm -r {shlex.quote(str(path))}  (or {_rebuild(ctx)})") for path in extra]
    return findings or [Finding("venv.site-packages", Status.OK, str(ctx.site_packages.relative_to(ctx.venv.path)),
                                "the only site-packages, the one the interpreter's version loads")]


def check_startup(ctx: Context) -> list[Finding]:
    """site.startup: sitecustomize/usercustomize in site-packages that no RECORD lists."""
    found = sorted(entry for entry in os.listdir(ctx.site_packages)
                   if entry.split(".")[0] in STARTUP_MODULES)
    recorded = recorded_paths(ctx) if found else set()
    findings = []
    for entry in found:
        if entry in recorded or f"{entry}/__init__.py" in recorded:
            continue  # a package's own file: files.modified checks its hash
        path = ctx.site_packages / entry
        findings.append(Finding("site.startup", Status.FAIL, printable(entry),
                                f"{printable(entry)} runs at every interpreter start and no installed package's "
                                f"RECORD lists it (planted by hand?)", f"rm -r {shlex.quote(str(path))}"))
    return findings or [Finding("site.startup", Status.OK, "site-packages",
                                "no sitecustomize or usercustomize outside a RECORD")]
