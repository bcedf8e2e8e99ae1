"""FP8 linears on Hopper: the frozen target's through torch._scaled_mm, the drafter's through torchao.

The target is frozen and only read, so its decoder linears can run in FP8 (e4m3): weights quantized
once with one scale per output channel, activations per token with a scale computed on the fly, the
product accumulated and written in bf16 by `torch._scaled_mm` (rowwise scales). The LM head and
embeddings stay bf16. The walk (what serving verifies against) runs the target in bf16: `bf16_target()`
switches the FP8 path off. The drafter trains in FP8 through torchao's float8 training (`Float8Linear`).

Where the device has no FP8 matmuls (CPU, GPUs before compute capability 8.9) `--fp8` is refused.
`Fp8Linear(emulate=True)` runs the same quantization with a float matmul: the numerics the tests check
on CPU.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from trainer.common.errors import TrainerInputError

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
CHOICES = ("off", "target", "drafter", "both")


def check_supported(fp8: str, device: torch.device) -> None:
    """One line, before any work, when the device cannot run FP8 matmuls."""
    if fp8 == "off":
        return
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        where = "a CPU" if device.type != "cuda" else f"compute capability {torch.cuda.get_device_capability(device)}"
        raise TrainerInputError(f"--fp8 {fp8} needs FP8 matmuls (a Hopper or Ada GPU, compute capability 8.9+); "
                                f"this run's device is {where}: drop --fp8")


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in e4m3, float32 scale per row) with x ~= q * scale: each row's largest magnitude maps to 448."""
    amax = x.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    quantized = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return quantized, scale


_compiled_quantize = None


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rowwise, compiled on CUDA: eager, its abs/amax/divide/clamp/cast are five passes over the
    activations per linear, which cost more than the FP8 GEMMs saved (measured: bench/RESULTS.md)."""
    global _compiled_quantize
    if x.device.type != "cuda":
        return quantize_rowwise(x)
    if _compiled_quantize is None:
        _compiled_quantize = torch.compile(quantize_rowwise, dynamic=False)
    return _compiled_quantize(x)


class Fp8Linear(nn.Module):
    """A frozen linear layer in FP8: per-output-channel weight scales, per-token dynamic activation scales."""

    def __init__(self, linear: nn.Linear, emulate: bool = False):
        super().__init__()
        self.linear = linear  # kept: the bf16 path (the walk, serving's view) reads it
        weight, scale = quantize_rowwise(linear.weight.detach())  # (out, in) e4m3, (out, 1)
        self.register_buffer("weight_fp8", weight, persistent=False)
        self.register_buffer("weight_scale", scale.t().contiguous(), persistent=False)  # (1, out)
        self.emulate = emulate
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return self.linear(x)
        shape = x.shape
        rows = x.reshape(-1, shape[-1])  # (tokens, in)
        quantized, scale = quantize_activations(rows)  # (tokens, in), (tokens, 1)
        if self.emulate:  # the same rounding, a float matmul: CPU tests
            out = (quantized.float() * scale) @ (self.weight_fp8.float() * self.weight_scale.t()).t()
            out = out.to(x.dtype)
        else:  # mat2 column-major: the row-major (out, in) weight, transposed
            out = torch._scaled_mm(quantized, self.weight_fp8.t(), scale_a=scale, scale_b=self.weight_scale,
                                   out_dtype=x.dtype)
        if self.linear.bias is not None:
            out = out + self.linear.bias
        return out.reshape(*shape[:-1], out.shape[-1])


def convert_target(model: nn.Module, *, emulate: bool = False) -> int:
    """Every linear of the target's decoder layers in FP8 (the LM head and embeddings stay); returns how many."""
    layers = model.model.layers
    count = 0
    for layer in layers:
        for name, child in list(layer.named_modules()):
            for attr, module in list(child.named_children()):
                if isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0:
                    setattr(child, attr, Fp8Linear(module, emulate=emulate))
                    count += 1
    return count


@contextlib.contextmanager
def bf16_target(model: nn.Module):
    """The target as serving verifies with it: its FP8 linears switched to their bf16 weights for the block."""
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    for module in fp8:
        module.enabled = False
    try:
        yield model
    finally:
        for module in fp8:
            module.enabled = True


def convert_drafter(drafter: nn.Module) -> None:
    """The drafter's linears trained in FP8 through torchao (dynamic scaling, its recipe's defaults)."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        raise TrainerInputError("--fp8 drafter needs torchao (float8 training) in the venv: use the cuda lock "
                                "profile, or `--fp8 target`") from None
    convert_to_float8_training(drafter, module_filter_fn=lambda module, name: isinstance(module, nn.Linear) and
                               module.in_features % 16 == 0 and module.out_features % 16 == 0)
