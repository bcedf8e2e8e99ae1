"""env.leak: variables and venv settings that let code from outside the venv in."""

from __future__ import annotations

import fnmatch
import glob
import os
import shlex
from pathlib import Path

from envkit.doctor.context import Context
from envkit.doctor.findings import Finding, Status

# Libraries whose second copy on the loader path fights the venv's torch.
CUDA_TORCH_LIBS = ("libcudart.so*", "libcublas*.so*", "libcudnn*.so*", "libnccl*.so*", "libtorch*.so*",
                   "libc10*.so*", "libnvrtc*.so*", "libcusparse*.so*", "libcuda.so*", "libcufft*.so*",
                   "libcurand*.so*", "libcusolver*.so*", "libnvJitLink*.so*", "libtriton*.so*")
ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def _outside_venv(entry: str, ctx: Context) -> bool:
    try:
        return not Path(entry).resolve().is_relative_to(ctx.venv.path.resolve())
    except OSError:
        return True


def _is_cuda_or_torch(library: str) -> bool:
    return any(fnmatch.fnmatch(Path(library).name, pattern) for pattern in CUDA_TORCH_LIBS)


def _carries_cuda_or_torch(directory: str) -> list[str]:
    found = []
    for pattern in CUDA_TORCH_LIBS:
        found += [Path(p).name for p in glob.glob(os.path.join(directory, pattern))]
    return sorted(found)


def check_env(ctx: Context) -> list[Finding]:
    findings = []
    env = ctx.environ
    pythonpath = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    outside = [e for e in pythonpath if _outside_venv(e, ctx)]
    if outside:
        findings.append(Finding("env.leak", Status.FAIL, "PYTHONPATH",
                                f"puts {', '.join(outside[:3])} ahead of the venv's packages", "unset PYTHONPATH"))
    if env.get("PYTHONHOME"):
        findings.append(Finding("env.leak", Status.FAIL, "PYTHONHOME",
                                f"={env['PYTHONHOME']} replaces the interpreter's standard library", "unset PYTHONHOME"))
    system_site = ctx.venv.pyvenv_cfg().get("include-system-site-packages", "false").lower() == "true"
    if system_site:
        findings.append(Finding("env.leak", Status.FAIL, "include-system-site-packages",
                                "pyvenv.cfg lets the system's and the user's site-packages into the venv",
                                f"envkit create --force --venv {shlex.quote(str(ctx.venv.path))}"))
    if env.get("PYTHONUSERBASE") and system_site:
        findings.append(Finding("env.leak", Status.WARN, "PYTHONUSERBASE",
                                f"={env['PYTHONUSERBASE']}: a user site that this venv reads", "unset PYTHONUSERBASE"))
    if env.get("PYTHONSTARTUP"):
        findings.append(Finding("env.leak", Status.WARN, "PYTHONSTARTUP",
                                "runs a file in interactive sessions", "unset PYTHONSTARTUP"))
    for entry in [e for e in env.get("LD_LIBRARY_PATH", "").split(":") if e]:
        libs = _carries_cuda_or_torch(entry) if _outside_venv(entry, ctx) else []
        if libs:
            findings.append(Finding("env.leak", Status.FAIL, "LD_LIBRARY_PATH",
                                    f"{entry} loads {', '.join(libs[:4])} ahead of the venv's own CUDA/torch "
                                    f"libraries", f"remove {entry} from LD_LIBRARY_PATH"))
    findings += _preloads(env.get("LD_PRELOAD", ""), ctx)
    if all(f.status == Status.OK for f in findings):
        findings.append(Finding("env.leak", Status.OK, "environment",
                                "no PYTHONPATH, PYTHONHOME, system site or CUDA/torch library path leaks in"))
    return findings


def _preloads(value: str, ctx: Context) -> list[Finding]:
    """LD_PRELOAD judged by what each library is: a CUDA/torch/NCCL library from elsewhere fights the
    venv's own build; an allocator (jemalloc, tcmalloc, mimalloc) or an unrelated library does not."""
    findings = []
    for entry in value.replace(":", " ").split():
        name = Path(entry).name
        if _is_cuda_or_torch(name) and _outside_venv(entry, ctx):
            findings.append(Finding("env.leak", Status.FAIL, "LD_PRELOAD",
                                    f"{entry} preloads {name} from outside the venv, ahead of its own CUDA/torch "
                                    f"build", f"remove {entry} from LD_PRELOAD"))
        else:
            kind = "an allocator" if any(a in name for a in ALLOCATORS) else "not a CUDA or torch library"
            findings.append(Finding("env.leak", Status.OK, "LD_PRELOAD", f"{entry}: {kind}; harmless to torch"))
    return findings
