"""Where a training step's device time goes: torch.profiler over a few steps after warm-up, kernels grouped.

    python bench/step_profile.py --preset qwen3_8b --variants flex --data-source chat_lengths --packing \
        [--fp8 target] [--no-fused] [--targets cuda:0 --drafters cuda:0] [--profile-steps 5]

Runs bench/train_throughput.py's variant with the profiler on for its last --profile-steps steps and prints
the table: milliseconds a step and share per kernel group (GEMMs, flex attention, the optimizer, triton-fused
compiled code, other eager elementwise/reductions/copies), beside the throughput figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent

# Kernel name patterns, first match wins: cuBLAS/CUTLASS GEMMs (and FP8 scaled GEMMs), flex attention's triton
# kernels, AdamW (fused or foreach), other triton kernels inductor generated, everything else.
GROUPS = (
    ("GEMMs (cuBLAS/CUTLASS, FP8 scaled)", re.compile(r"gemm|cutlass|xmma|nvjet|scaled_mm|cublas|sm90_", re.I)),
    ("flex attention", re.compile(r"flex|triton_tem_fused_flex", re.I)),
    ("optimizer (AdamW)", re.compile(r"adam|multi_tensor_apply", re.I)),
    ("compiled (triton fused)", re.compile(r"^triton_", re.I)),
    ("other eager (elementwise, reductions, copies)", re.compile(r".*")),
)


def group_kernels(kernels: list[tuple[str, float]], steps: int) -> list[dict]:
    """[(kernel name, total device microseconds)] -> one row per group: ms a step and share of the total."""
    totals = {name: 0.0 for name, _ in GROUPS}
    for kernel, micros in kernels:
        group = next(name for name, pattern in GROUPS if pattern.search(kernel))
        totals[group] += micros
    whole = sum(totals.values()) or 1.0
    return [{"group": name, "ms_per_step": round(us / 1000 / steps, 2), "share": round(us / whole, 4)}
            for name, us in totals.items()]


def kernels_of(profiler) -> list[tuple[str, float]]:
    """Device kernels (events that ran on the GPU, not the CPU-side ops that launched them, which would count
    their children's time again) and their total device time from a finished torch.profiler run."""
    from torch.autograd import DeviceType

    out = []
    for event in profiler.key_averages():
        if event.device_type == DeviceType.CUDA:
            out.append((event.key, float(getattr(event, "device_time_total", 0) or event.self_device_time_total)))
    return out


def render(rows: list[dict]) -> str:
    lines = ["| kernels | ms/step | share |", "| --- | --- | --- |"]
    lines += [f"| {r['group']} | {r['ms_per_step']} | {r['share']:.1%} |" for r in rows]
    lines.append(f"| total | {sum(r['ms_per_step'] for r in rows):.1f} | 100% |")
    return "\n".join(lines)


def main() -> None:
    args = sys.argv[1:]
    if "--profile-steps" not in args:
        args += ["--profile-steps", "5"]
    sys.exit(subprocess.run([sys.executable, str(PROJECT / "bench" / "train_throughput.py"), *args]).returncode)


if __name__ == "__main__":
    main()
