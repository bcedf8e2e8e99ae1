"""torch.build and torch.hazard: the installed torch's build, and which known hazards apply to it.

Hazards are decided by reading torch's own source files in the venv (HAZARDS.md), not by a
version table alone: a backport or a patched build shows in the source.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from envkit.trainerproc import hazard_proof as selftest
from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Status
from envkit.trainerproc.source import trainer_digest
from envkit.support.trainer_helpers import MITIGATIONS


def _driver_cuda_version() -> str | None:
    """The CUDA version the driver supports, from nvidia-smi's header; None without a GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return match[1] if match else None


def _expected_cuda(ctx: Context) -> str | None | bool:
    """The CUDA variant the profile asks for: '13.0', None for CPU, False when it does not say."""
    backend = ctx.profile.torch_backend if ctx.profile else None
    if backend == "cpu":
        return None
    if backend and backend.startswith("cu") and backend[2:].isdigit():
        digits = backend[2:]
        return f"{digits[:-1]}.{digits[-1]}"
    return False


def check_build(ctx: Context) -> list[Finding]:
    build = ctx.torch_build
    if build is None:
        return [Finding("torch.build", Status.OK, "torch", "torch is not installed in this venv")]
    findings = []
    version, cuda = build["version"], build["cuda"]
    variant = f"CUDA {cuda}" if cuda else "CPU"
    expected = _expected_cuda(ctx)
    if expected is not False and expected != cuda:
        wanted = f"CUDA {expected}" if expected else "CPU"
        findings.append(Finding("torch.build", Status.FAIL, "torch",
                                f"torch {version} is a {variant} build; the profile's torch-backend asks for {wanted}",
                                ctx.fix_command()))
    torch_dists = ctx.by_name.get("torch", [])
    for line in torch_dists[0].requires if torch_dists else ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name != "triton" or "extra" in str(req.marker or ""):
            continue
        triton = ctx.by_name.get("triton")
        if not triton:
            if cuda:
                findings.append(Finding("torch.build", Status.FAIL, "triton",
                                        f"torch {version} requires {req} and triton is missing", ctx.fix_command()))
        else:
            try:
                fits = req.specifier.contains(Version(triton[0].version), prereleases=True)
            except InvalidVersion:
                fits = False
            if not fits:
                findings.append(Finding("torch.build", Status.FAIL, "triton",
                                        f"torch {version} pins {req}; triton {triton[0].version} is installed",
                                        ctx.fix_command()))
    driver = _driver_cuda_version()
    if cuda and driver and Version(driver) < Version(cuda):
        findings.append(Finding("torch.build", Status.FAIL, "driver",
                                f"the driver supports CUDA {driver}; torch is built for CUDA {cuda}",
                                "update the NVIDIA driver, or use a profile for an older CUDA"))
    detail = f"; driver supports CUDA {driver}" if driver else ""
    return findings or [Finding("torch.build", Status.OK, "torch", f"torch {version}, {variant} build{detail}")]


@dataclass(frozen=True)
class Hazard:
    id: str
    title: str
    applies: Callable[[Context], bool]


def _source_has(relative: str, pattern: str) -> Callable[[Context], bool]:
    def applies(ctx: Context) -> bool:
        source = ctx.torch_source(relative)
        return bool(source and re.search(pattern, source, re.M))
    return applies


def _version_below(bound: str) -> Callable[[Context], bool]:
    def applies(ctx: Context) -> bool:
        try:
            return Version(ctx.torch_build["version"]).release < Version(bound).release
        except (InvalidVersion, TypeError):
            return False
    return applies


HAZARDS = (
    Hazard("H1", "FX tracing flag is process-global: a trace in one thread makes compiled calls in others raise "
           "or run eager", _source_has("fx/_symbolic_trace.py", r"^_is_fx_tracing_flag\s*=")),
    Hazard("H2", "FX patches nn.Module.__call__ process-wide during a symbolic trace: other threads' module calls "
           "are routed into the foreign tracer",
           _source_has("fx/_symbolic_trace.py", r'patch_method\(\s*torch\.nn\.Module,\s*"__call__"')),
    Hazard("H3", "dynamo config is thread-local: settings made in the main thread do not apply in workers",
           _source_has("utils/_config_module.py", r"user_override\s*=\s*ContextVar\(")),
    Hazard("H4", "every new input shape recompiles inside the training step (seconds of stall, triggers H1/H2)",
           _source_has("_dynamo/config.py", r"^recompile_limit\s*=")),
    Hazard("H5", "the default inductor cache is a shared temp dir loaded with pickle and import",
           _source_has("_inductor/runtime/cache_dir_utils.py", r"gettempdir\(\)")),
    Hazard("H6", "concurrent readers may unpickle a half-written cache entry (fixed in 2.11.0)", _version_below("2.11")),
    Hazard("H7", "flex_attention has no backward on CPU",
           _source_has("nn/attention/flex_attention.py", r"does not support backward on CPU")),
    Hazard("H8", "eager flex_attention materialises the full score matrix (a silent fallback costs ~4x and memory)",
           _source_has("nn/attention/flex_attention.py", r"materializes the full scores matrix")),
)


def _hazard_finding(ctx: Context, hazard: Hazard, record: dict | None, digest: str) -> Finding:
    """ok only for a mitigation whose self-test passed in this venv, for this torch and this trainer source."""
    version = ctx.torch_build["version"]
    verify = f"envkit warm-cache --venv {shlex.quote(str(ctx.venv.path))}"
    outcome, detail = selftest.status(record, version, digest, hazard.id)
    head = f"applies to torch {version}: {hazard.title}"
    mitigation = MITIGATIONS.get(hazard.id)
    if outcome == "passed":
        return Finding("torch.hazard", Status.OK, hazard.id,
                       f"{head}; mitigated: {mitigation.mitigation} (self-test {mitigation.selftest} passed in this "
                       f"venv: {detail})")
    if outcome == "failed":
        return Finding("torch.hazard", Status.FAIL, hazard.id,
                       f"{head}; NOT mitigated: self-test {mitigation.selftest} failed ({detail})",
                       f"restore {mitigation.where} (see HAZARDS.md {hazard.id}), then `{verify}`")
    return Finding("torch.hazard", Status.WARN, hazard.id, f"{head}; mitigation not verified: {detail}",
                   f"{verify} (runs the trainer's self-tests in this venv)")


def check_hazards(ctx: Context) -> list[Finding]:
    if ctx.torch_build is None:
        return [Finding("torch.hazard", Status.OK, "torch", "torch is not installed; no torch hazards")]
    applying = [hazard for hazard in HAZARDS if hazard.applies(ctx)]
    if not applying:
        return [Finding("torch.hazard", Status.OK, "torch", "no known hazard applies to this torch")]
    record, digest = selftest.read(ctx.venv), trainer_digest()
    return [_hazard_finding(ctx, hazard, record, digest) for hazard in applying]
