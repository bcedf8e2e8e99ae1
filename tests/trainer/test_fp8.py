"""FP8 on CPU: refused where there are no FP8 matmuls; the emulated path's numerics; the setting in the cache key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import PROJECT

torch = pytest.importorskip("torch")

from trainer.config.schema import tiny  # noqa: E402
from trainer.model import fp8  # noqa: E402
from trainer.model.target import build_target, tapped_states  # noqa: E402


def test_fp8_is_refused_without_fp8_matmuls(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainer", "train", "--preset", "tiny", "--fp8", "target", "--steps",
                           "1", "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=PROJECT, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: --fp8 target needs FP8 matmuls")
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_the_emulated_fp8_linear_errs_within_e4m3s_bound_and_not_zero():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 192, bias=True)
    x = torch.randn(64, 256)
    reference = x.double() @ linear.weight.double().t() + linear.bias.double()
    out = fp8.Fp8Linear(linear, emulate=True)(x).double()
    error = float((out - reference).norm() / reference.norm())
    assert 0.005 < error < 0.08, error  # e4m3 keeps 3 mantissa bits: a few percent, never exact
    quantized, scale = fp8.quantize_rowwise(x)
    assert quantized.dtype == torch.float8_e4m3fn and float((quantized.float() * scale).abs().max()) <= \
        float(x.abs().max()) * 1.07


def test_an_fp8_target_taps_nearly_the_same_states_and_walks_in_bf16():
    cfg = tiny()
    model = build_target(cfg.target)
    tokens = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(0))
    exact = tapped_states(model, tokens, None, [1, 3])
    assert fp8.convert_target(model, emulate=True) == 4 * 7
    quantized = tapped_states(model, tokens, None, [1, 3])
    error = float((quantized - exact).norm() / exact.norm())
    assert 0 < error < 0.1, error
    with fp8.bf16_target(model):  # serving's view: the kept weights, exactly
        assert torch.equal(tapped_states(model, tokens, None, [1, 3]), exact)


def test_the_fp8_setting_reaches_the_cache_key():
    def described(*extra):
        proc = subprocess.run([sys.executable, "-m", "trainer", "describe", "--preset", "tiny", *extra],
                              capture_output=True, text=True, cwd=PROJECT, timeout=120, check=True)
        return json.loads(proc.stdout)["config"]

    assert described()["fp8"] == "off" and described("--fp8", "both")["fp8"] == "both"
