"""Export a checkpoint to the DFlash serving format that SGLang, vLLM and the reference `dflash` load.

DIR/config.json      a Qwen3 config of the drafter with `architectures: ["DFlashDraftModel"]` and `dflash_config`
DIR/model.safetensors the drafter's weights under the reference's parameter names (no embedding, no LM head)
DIR/target/          for a random target (presets): the frozen target exactly as trained against, with the
                     run's tokenizer when it had one
DIR/envkit-export.json what was exported from where (training config, chat template kwargs, digests)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from trainer.config import TrainConfig
from trainer.errors import TrainerInputError

EXPORT_MANIFEST = "envkit-export.json"

# Trainer parameter name (within layers.N.) -> the reference's.
LAYER_NAMES = {
    "input_norm.weight": "input_layernorm.weight",
    "post_norm.weight": "post_attention_layernorm.weight",
    **{f"{p}_proj.weight": f"self_attn.{p}_proj.weight" for p in "qkvo"},
    **{f"{p}_norm.weight": f"self_attn.{p}_norm.weight" for p in "qk"},
    **{f"{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
}
TOP_NAMES = {"fuse.weight": "fc.weight", "fuse_norm.weight": "hidden_norm.weight", "final_norm.weight": "norm.weight"}


def serving_name(name: str) -> str:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    prefix, index, rest = name.split(".", 2)
    if prefix != "layers" or rest not in LAYER_NAMES:
        raise ValueError(f"drafter parameter {name!r} has no DFlash serving name")
    return f"layers.{index}.{LAYER_NAMES[rest]}"


def serving_state_dict(drafter_state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {serving_name(name): tensor.detach().to("cpu", dtype).contiguous() for name, tensor in drafter_state.items()}


def drafter_config(cfg: TrainConfig, layer_ids: list[int], mask_token_id: int, dtype: str,
                   chat_template_kwargs: dict | None) -> dict:
    """config.json: the drafter as a Qwen3 model, the target's attention geometry, and dflash_config."""
    target, drafter = cfg.target, cfg.drafter
    rope = {"rope_type": "default", "rope_theta": target.rope_theta}
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": drafter.intermediate_size or target.intermediate_size,
        "num_hidden_layers": drafter.num_layers,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "rope_parameters": rope,
        "rope_theta": target.rope_theta,  # readers older than transformers 5 take theta from here
        "rope_scaling": None,
        "max_position_embeddings": target.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * drafter.num_layers,
        "dtype": dtype,
        "num_target_layers": target.num_layers,
        "block_size": drafter.block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids),
                          "block_size": drafter.block_size},
        # How the training data was rendered: serve with the same template kwargs (e.g. enable_thinking).
        "chat_template_kwargs": chat_template_kwargs,
    }


def weights_checksum(model: torch.nn.Module) -> list[float]:
    """Cheap identity of a model's weights, computed on their device: per-tensor float64 sums of x and |x|."""
    with torch.no_grad():  # accumulated in float64 without a float64 copy of an 8B model
        return [float(t.sum(dtype=torch.float64)) for p in model.state_dict().values() for t in (p, p.abs())]


def same_checksum(a: list[float], b: list[float]) -> bool:
    # Reduction order may vary with the thread count: equal up to float64 rounding.
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6) for x, y in zip(a, b))


def _rebuild_target(cfg: TrainConfig, recorded: dict) -> torch.nn.Module:
    """The random target, rebuilt on the device type and dtype it was trained with, checked by checksum."""
    from trainer.target import build_target

    device_type, dtype = recorded["device_type"], getattr(torch, recorded["dtype"])
    if device_type == "cuda" and not torch.cuda.is_available():
        raise TrainerInputError("this drafter was trained against a random target initialised on CUDA; its "
                                "weights can only be rebuilt there: export on a machine with a GPU")
    model = build_target(cfg.target, device=device_type, dtype=dtype)
    if not same_checksum(weights_checksum(model), recorded["checksum"]):
        raise TrainerInputError("the rebuilt random target differs from the one the drafter was trained against "
                                "(another torch version or device?); export with the run's venv on its machine")
    return model.to("cpu")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_export(path: Path) -> bool:
    """An export envkit made (so --force may replace it): its manifest is there."""
    return (path / EXPORT_MANIFEST).is_file() and not path.is_symlink()


def _place(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished export into place; --force swaps out a previous export only."""
    if not out.exists():
        os.replace(tmp, out)
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        out.rmdir()
        os.replace(tmp, out)
        return
    if not force:
        raise TrainerInputError(f"{out} exists and is not empty; choose another --out or pass --force to replace "
                                f"a previous export")
    if not _is_export(out):
        raise TrainerInputError(f"{out} is not an export made by envkit (no {EXPORT_MANIFEST}); refusing to replace "
                                f"it even with --force: choose another --out")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def export(ckpt: Path, out: Path, *, force: bool = False, dtype: str | None = None) -> dict:
    """Write DIR atomically (a temporary sibling renamed into place); returns the manifest."""
    from safetensors.torch import save_file

    from trainer import checkpoint

    out = Path(out).absolute()
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise TrainerInputError(f"{out} exists and is not empty; choose another --out or pass --force")
    if not out.parent.is_dir():
        raise TrainerInputError(f"{out.parent} does not exist; create it first or choose another --out")
    state = checkpoint.load(Path(ckpt))
    cfg = TrainConfig.from_dict(state["config"])
    meta = state.get("export") or {}
    weights_dtype = dtype or meta.get("dtype", "float32")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        config = drafter_config(cfg, state["layer_ids"], state["mask_token_id"], weights_dtype,
                                meta.get("chat_template_kwargs"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(serving_state_dict(state["drafter"], getattr(torch, weights_dtype)), str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        target_dir = None
        if not cfg.target.path:
            target_dir = tmp / "target"
            model = _rebuild_target(cfg, meta["target"])
            model.config.architectures = [type(model).__name__]
            model.save_pretrained(target_dir)
        tokenizer = meta.get("tokenizer")
        if tokenizer:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer).save_pretrained(target_dir or tmp)
        manifest = {
            "format": "dflash", "checkpoint": str(Path(ckpt).absolute()), "step": state["step"],
            "target": "target/" if target_dir else cfg.target.path, "tokenizer": tokenizer,
            "chat_template_kwargs": meta.get("chat_template_kwargs"), "training_config": cfg.to_dict(),
            "files": {str(p.relative_to(tmp)): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()},
        }
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _place(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**manifest, "out": str(out)}
