"""The frozen target compiled by region (issue 31): the same tapped states as eager, one graph for every layer,
none for the decoding walk's growing shapes, and the setting in the cache key."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.utils import counters  # noqa: E402

from trainer.config.schema import tiny  # noqa: E402
from trainer.model.target import build_target, compile_layers, compiled_target, tapped_states  # noqa: E402


def test_compiled_layers_tap_the_same_states_with_one_graph_and_leave_the_walk_eager():
    cfg = tiny()
    model = build_target(cfg.target, device="cpu", dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.target.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(40), torch.arange(24)]).repeat(2, 1)  # two packed documents a row
    layer_ids = [1, 2]
    with torch.no_grad():
        eager = tapped_states(model, ids, None, layer_ids, positions)
        assert compile_layers(model) == len(model.model.layers) and compile_layers(model) == 0  # once per model
        torch._dynamo.reset()
        counters.clear()
        with compiled_target():
            first = tapped_states(model, ids, None, layer_ids, positions)
            again = tapped_states(model, ids, None, layer_ids, positions)
        graphs = counters["stats"]["unique_graphs"]
        outside = tapped_states(model, ids[:, :33], None, layer_ids, positions[:, :33])  # a walk-like new shape
    assert graphs == 1  # every layer and the repeat reuse one graph: same code, same shape, weights as inputs
    assert counters["stats"]["unique_graphs"] == graphs  # the eager path compiled nothing
    for states in (first, again):
        assert torch.allclose(states, eager, rtol=1e-2, atol=1e-2), float((states - eager).abs().max())
    assert outside.shape[1] == 33


def test_compile_target_is_part_of_the_cache_key():
    on, off = tiny(), tiny()
    on.compile_target, off.compile_target = True, False
    assert on.compile_key() != off.compile_key()
