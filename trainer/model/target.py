"""The frozen target: a transformers causal LM that returns the hidden states of its tapped layers."""

from __future__ import annotations

import contextlib
import copy
import math
import threading
from pathlib import Path

import torch
from torch import nn

from trainer.common.errors import TrainerInputError
from trainer.common.hf_logging import quiet_transformers
from trainer.config.schema import TargetConfig
from trainer.model import target_attention
from trainer.targets.locate import target_dir


def _qwen3_config(cfg: TargetConfig):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                       num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
                       max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False)


def build_target(cfg: TargetConfig, *, device: str | torch.device = "cpu", dtype=torch.float32,
                 meta: bool = False, log=print) -> nn.Module:
    """From a local path or a built recipe (from_pretrained), or from the config with random weights from a
    fixed seed."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    path = target_dir(cfg, log)
    if path:
        if not Path(path).is_dir():
            raise TrainerInputError(f"target path {path} is not a directory; give a local HF model dir with --target")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=target_attention.install(),
                                                     local_files_only=True)
    else:
        config = _qwen3_config(cfg)
        config._attn_implementation = target_attention.install()
        if meta:
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(config)
        device = torch.device(device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
            torch.manual_seed(cfg.seed)
            # Initialised on the device itself: an 8B random init on the host takes minutes.
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            with torch.no_grad():
                # A random target is near-uniform; larger embeddings give it peaked, learnable outputs.
                model.get_input_embeddings().weight.mul_(cfg.embedding_scale)
    model.requires_grad_(False)
    return model.eval().to(device)


def rope_theta_of(config) -> float:
    """RoPE theta of a transformers config; refuses scaling the drafter does not implement.

    transformers 5 keeps theta in `rope_parameters`; older configs have `rope_theta` and `rope_scaling`.
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type") or params.get("type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        raise TrainerInputError(f"the target uses RoPE scaling {rope_type!r}, which the drafter does not implement "
                                f"(only default RoPE); use a target without rope scaling")
    theta = params.get("rope_theta") or getattr(config, "rope_theta", None)
    if not theta:
        raise TrainerInputError("the target's config names no rope_theta (neither rope_parameters nor rope_theta)")
    return float(theta)


# The families the trainer drives as a target: decoder layers under `model.layers` whose hidden states it taps,
# attention through transformers' attention interface (the trainer's packed-document mask), RoPE from the config
# (rope_theta_of refuses scaling), an embedding and LM head the drafter shares. Qwen2 covers Qwen2.5.
SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def check_family(config) -> None:
    """One line for a target the trainer cannot drive (another layout, attention or RoPE scheme): never
    approximated."""
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise TrainerInputError(f"the target is a {str(family)[:40]!r} model; the DFlash drafter mirrors "
                                f"{', '.join(SUPPORTED_FAMILIES)} targets only (docs/trainer.md: supported targets)")


def sync_config_from_model(cfg: TargetConfig, model: nn.Module) -> None:
    """A pretrained target's real shapes, RoPE and norm epsilon override the preset's."""
    config = model.config
    check_family(config)
    cfg.vocab_size, cfg.hidden_size = config.vocab_size, config.hidden_size
    cfg.intermediate_size, cfg.num_layers = config.intermediate_size, config.num_hidden_layers
    cfg.num_heads, cfg.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
    cfg.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cfg.rope_theta = rope_theta_of(config)
    cfg.rms_norm_eps = float(getattr(config, "rms_norm_eps", cfg.rms_norm_eps))
    cfg.max_position_embeddings = getattr(config, "max_position_embeddings", cfg.max_position_embeddings)


def _has_sliding_layers(model: nn.Module) -> bool:
    return "sliding_attention" in (getattr(model.config, "layer_types", None) or [])


def up_to_layer(model: nn.Module, last: int) -> nn.Module:
    """The target's decoder stopped after layer `last`: the layers past the last tapped one feed nothing the
    drafter reads (on qwen3_8b, taps 1..33 of 36 leave two layers, ~5% of the step). A view sharing the
    model's weights, made once per model, whose output nobody reads: the taps are recorded by hooks on the
    layers (`recorded_taps`). The full model stays for the decoding walk, which needs logits."""
    if last >= len(model.model.layers) - 1:
        return model.model
    views = model.__dict__.setdefault("_envkit_views", {})
    if last not in views:
        base = model.model
        view = copy.copy(base)
        view._modules = dict(base._modules)  # copy.copy would share the submodule table with the full model
        view.layers = nn.ModuleList(list(base.layers)[: last + 1])
        view.norm = nn.Identity()
        views[last] = view
    return views[last]


# The tapped layers' outputs are recorded by forward hooks of our own, not read from transformers'
# `output_hidden_states`: transformers 5 records those by hooks it installs on the layers once per model
# object, and the view above is another object over the same layers, so after the view ran, the full
# model reported each shared layer twice and `hidden_states[i + 1]` was an earlier layer's output (the
# walk read layer 1 for layer 2 on code_tiny; random targets' layers are too alike to show it).
_recording = threading.local()


def _install_tap_hooks(model: nn.Module) -> None:
    if "_envkit_tap_hooks" in model.__dict__:
        return

    def hook(index: int):
        def record(module, args, output):
            box = getattr(_recording, "box", None)
            if box is not None and index in box["want"]:
                box["got"][index] = output[0] if isinstance(output, tuple) else output
        return record

    model.__dict__["_envkit_tap_hooks"] = [layer.register_forward_hook(hook(i))
                                           for i, layer in enumerate(model.model.layers)]


@contextlib.contextmanager
def recorded_taps(model: nn.Module, layer_ids: list[int]):
    """Within: forwards of `model` (or its views) record the outputs of the layers `layer_ids`, in this thread.
    Yields a function returning them concatenated (B, S, taps*H), as the reference reads them from
    `hidden_states[i + 1]`: the last layer's output after the final norm."""
    _install_tap_hooks(model)
    box = {"want": set(layer_ids), "got": {}}
    _recording.box = box
    last = len(model.model.layers) - 1

    def states() -> torch.Tensor:
        return torch.cat([model.model.norm(box["got"][i]) if i == last else box["got"][i] for i in layer_ids], dim=-1)

    try:
        yield states
    finally:
        _recording.box = None


# The frozen target compiled by region: each decoder layer's forward through one torch.compile'd function, so
# one graph (per shape) serves every layer (same code, same shapes; the weights are inputs) and its RMSNorm,
# rotary, SiLU and casts fuse. Only training's tapped forwards take it (fixed bucket shapes): the decoding
# walk grows its sequence every step and stays eager, so compiled graphs never see a new shape there.
_compiled_region = threading.local()


def compile_layers(model: nn.Module) -> int:
    """Give each decoder layer a compiled forward used inside `compiled_target()`; returns layers compiled."""
    count = 0
    for layer in model.model.layers:
        if "_envkit_eager_forward" in layer.__dict__:
            continue
        eager = layer.forward
        compiled = torch.compile(eager, dynamic=False)

        def forward(*args, _eager=eager, _compiled=compiled, **kwargs):
            wanted = getattr(_compiled_region, "on", False) and not getattr(_compiled_region, "eager", False)
            return (_compiled if wanted else _eager)(*args, **kwargs)

        layer.__dict__["_envkit_eager_forward"] = eager
        layer.forward = forward
        count += 1
    return count


@contextlib.contextmanager
def _region_flag(name: str):
    """Within (this thread): `_compiled_region.<name>` is True, restored after."""
    before = getattr(_compiled_region, name, False)
    setattr(_compiled_region, name, True)
    try:
        yield
    finally:
        setattr(_compiled_region, name, before)


def compiled_target():
    """Within (this thread): layers given a compiled forward by `compile_layers` run it."""
    return _region_flag("on")


def eager_target():
    """Within (this thread): the eager layers even inside `compiled_target()`, e.g. for an evaluation against
    the target switched to bf16 (trainer/model/fp8.py), whose code path the compiled graphs were not made for."""
    return _region_flag("eager")


@torch.no_grad()
def tapped_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  layer_ids: list[int], position_ids: torch.Tensor | None = None,
                  doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """input_ids (B, S) -> concatenated outputs of the tapped decoder layers (B, S, taps*H).

    Packed rows pass no attention mask and position_ids that restart per document. With doc_ids too
    (B, S), attention is flex over a document-causal BlockMask (trainer/model/target_attention.py); without,
    transformers builds a dense block-diagonal causal mask (its packed-sequence format) for SDPA.
    Either way no document sees another.
    """
    if doc_ids is not None and not _has_sliding_layers(model):
        # A ready mask goes to the layers as is (transformers passes a 4-D mask or BlockMask through; a mask
        # mapping only models with sliding layers take): no dense mask is built.
        attention_mask = target_attention.document_mask(doc_ids)
    with recorded_taps(model, layer_ids) as states:
        up_to_layer(model, max(layer_ids))(input_ids=input_ids, attention_mask=attention_mask,
                                           position_ids=position_ids, use_cache=False)
        return states()


def weights_checksum(model: torch.nn.Module) -> list[float]:
    """Cheap identity of a model's weights, computed on their device: per-tensor float64 sums of x and |x|."""
    with torch.no_grad():  # accumulated in float64 without a float64 copy of an 8B model
        return [float(t.sum(dtype=torch.float64)) for p in model.state_dict().values() for t in (p, p.abs())]


def same_checksum(a: list[float], b: list[float]) -> bool:
    # Reduction order may vary with the thread count: equal up to float64 rounding.
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6) for x, y in zip(a, b))
