"""Which torch build this interpreter holds, and the CPU kernels it dispatches to, read without importing torch.

`describe` runs before every warm-up, run and cache check to key the compile cache; importing torch was 1.5 s
of its 1.9 s. For a build without an accelerator the answer is in torch/version.py and the CPU's flags;
anything else (a CUDA, ROCm or XPU build, ATEN_CPU_CAPABILITY set, not x86-64 Linux) is answered by torch.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import platform
from pathlib import Path

ACCELERATORS = ("cuda", "hip", "rocm", "xpu")


def version_fields() -> dict | None:
    """torch/version.py's literal assignments (`__version__`, `cuda`, ...), parsed, never executed; None when
    torch is not installed or the file is not what torch writes."""
    spec = importlib.util.find_spec("torch")  # finds the package without running its __init__
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    fields = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) and node.value is not None else None
        if isinstance(target, ast.Name):
            try:
                fields[target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return fields if isinstance(fields.get("__version__"), str) else None


def cpu_capability(flags: set[str]) -> str:
    """The vector ISA torch's CPU kernels dispatch to, by ATen's rule (aten/src/ATen/native/DispatchStub.cpp,
    compute_cpu_capability): AVX512 with AVX-512 VL, BW and DQ plus FMA, else AVX2 with FMA, else DEFAULT."""
    if {"avx512vl", "avx512bw", "avx512dq", "fma"} <= flags:
        return "AVX512"
    if {"avx2", "fma"} <= flags:
        return "AVX2"
    return "DEFAULT"


def cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return None


def without_import() -> dict | None:
    """{"torch", "cuda", "device"} as `describe` reports them from torch, where that is certain without torch:
    a build with no accelerator on x86-64 Linux, ATEN_CPU_CAPABILITY unset. Else None: import torch and ask."""
    fields = version_fields()
    if fields is None or any(fields.get(name) is not None for name in ACCELERATORS):
        return None
    if platform.system() != "Linux" or platform.machine() != "x86_64" or "ATEN_CPU_CAPABILITY" in os.environ:
        return None
    flags = cpu_flags()
    if flags is None:
        return None
    return {"torch": fields["__version__"], "cuda": None, "device": f"cpu ({cpu_capability(flags)})"}
