"""Export a checkpoint to the DFlash serving format that SGLang, vLLM and the reference `dflash` load.

DIR/config.json      a Qwen3 config of the drafter with `architectures: ["DFlashDraftModel"]` and `dflash_config`
DIR/model.safetensors the drafter's weights under the reference's parameter names (no embedding, no LM head)
DIR/target/          for a random or recipe-built target (presets): the frozen target exactly as trained
                     against, with the run's tokenizer when it had one
DIR/README.md        the model card: target, data, training, walk figures, how to serve it (trainer/export/modelcard.py)
DIR/envkit-export.json what was exported from where (training config, chat template kwargs, digests)
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from trainer.common.errors import TrainerInputError
from trainer.common.files import file_sha256, follow_umask, weights_digest
from trainer.config.schema import TrainConfig
from trainer.export import modelcard
from trainer.export.place import EXPORT_MANIFEST, check_out, place
from trainer.model.target import build_target, same_checksum, weights_checksum
from trainer.targets.locate import target_dir
from trainer.targets import maketarget
from trainer.train import checkpoint

# Trainer parameter name (within layers.N.) -> the reference's.
def serving_state_dict(drafter_state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The drafter's weights as served: its parameters carry the reference model's names already."""
    return {name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in drafter_state.items()}


def serving_names(num_layers: int) -> set[str]:
    """Every weight a DFlash drafter of `num_layers` layers has (DESIGN.md's serving format)."""
    layer = [f"self_attn.{p}_proj.weight" for p in "qkvo"] + [f"self_attn.{p}_norm.weight" for p in "qk"] \
        + [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")] \
        + ["input_layernorm.weight", "post_attention_layernorm.weight"]
    return {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"layers.{i}.{name}" for i in range(num_layers)
                                                                  for name in layer}


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


def _rebuild_target(cfg: TrainConfig, recorded: dict) -> torch.nn.Module:
    """The random target, rebuilt on the device type and dtype it was trained with, checked by checksum."""
    device_type, dtype = recorded["device_type"], getattr(torch, recorded["dtype"])
    if device_type == "cuda" and not torch.cuda.is_available():
        raise TrainerInputError("this drafter was trained against a random target initialised on CUDA; its "
                                "weights can only be rebuilt there: export on a machine with a GPU")
    model = build_target(cfg.target, device=device_type, dtype=dtype)
    if not same_checksum(weights_checksum(model), recorded["checksum"]):
        raise TrainerInputError("the rebuilt random target differs from the one the drafter was trained against "
                                "(another torch version or device?); export with the run's venv on its machine")
    return model.to("cpu")


def _target_record(cfg: TrainConfig) -> dict | None:
    """The build record of a recipe target (trainer/targets/maketarget.py), for the model card."""
    if cfg.target.path or not cfg.target.recipe:
        return None
    return maketarget.read_manifest(Path(target_dir(cfg.target)))


DTYPES = ("float32", "bfloat16", "float16")


def _export_meta(state: dict, dtype: str | None) -> dict:
    """The checkpoint's export record, checked as data: dtypes by name, the target identity's shape, and a
    tokenizer that is a local directory (a hub name would make the export reach the network)."""
    meta = state.get("export") or {}
    if not isinstance(meta, dict):
        raise TrainerInputError("the checkpoint's export record is not a mapping; the checkpoint is damaged")
    weights_dtype = dtype or meta.get("dtype", "float32")
    if weights_dtype not in DTYPES:
        raise TrainerInputError(f"the checkpoint's dtype {str(weights_dtype)[:40]!r} is not one of {', '.join(DTYPES)}")
    target = meta.get("target")
    if target is not None and not (isinstance(target, dict) and target.get("device_type") in ("cpu", "cuda")
                                   and target.get("dtype") in DTYPES and isinstance(target.get("checksum"), list)
                                   and all(isinstance(x, float) for x in target["checksum"])):
        raise TrainerInputError("the checkpoint's target identity is malformed; the checkpoint is damaged")
    tokenizer = meta.get("tokenizer")
    if tokenizer is not None and not (isinstance(tokenizer, str) and Path(tokenizer).is_absolute()
                                      and Path(tokenizer).is_dir()):
        raise TrainerInputError(f"the checkpoint's tokenizer {str(tokenizer)[:200]!r} is not a local directory; "
                                f"export never fetches a tokenizer (copy it beside the export by hand)")
    template = meta.get("chat_template_kwargs")
    if template is not None and not isinstance(template, dict):
        raise TrainerInputError("the checkpoint's chat_template_kwargs is not a mapping; the checkpoint is damaged")
    return {"dtype": weights_dtype, "target": target, "tokenizer": tokenizer, "chat_template_kwargs": template}


def export(ckpt: Path, out: Path, *, force: bool = False, dtype: str | None = None) -> dict:
    """Write DIR atomically (a temporary sibling renamed into place); returns the manifest."""
    from safetensors.torch import save_file

    out = Path(out).absolute()
    check_out(out, force)
    state = checkpoint.load(Path(ckpt))
    cfg = TrainConfig.from_dict(state["config"])
    meta = _export_meta(state, dtype)
    if not cfg.target.path and meta["target"] is None:
        raise TrainerInputError("the checkpoint records no target identity for its random target; it cannot be "
                                "rebuilt exactly: export a checkpoint this trainer wrote")
    weights = serving_state_dict(state["drafter"], getattr(torch, meta["dtype"]))
    expected = serving_names(cfg.drafter.num_layers)
    if set(weights) != expected:
        odd = sorted(expected ^ set(weights))[0]
        raise TrainerInputError(f"the checkpoint's drafter weights do not match its config ({odd!r} missing or "
                                f"extra); the checkpoint is damaged")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        config = drafter_config(cfg, state["layer_ids"], state["mask_token_id"], meta["dtype"],
                                meta["chat_template_kwargs"])
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        target_dir = None
        if not cfg.target.path:
            target_dir = tmp / "target"
            model = _rebuild_target(cfg, meta["target"])
            model.config.architectures = [type(model).__name__]
            model.save_pretrained(target_dir)
        if meta["tokenizer"]:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(meta["tokenizer"], local_files_only=True).save_pretrained(target_dir or tmp)
        (tmp / "README.md").write_text(modelcard.render(
            cfg, state["step"], state["layer_ids"], state["mask_token_id"], modelcard.read_summary(Path(ckpt).parent),
            _target_record(cfg), meta["dtype"]))
        manifest = {
            "format": "dflash", "checkpoint": str(Path(ckpt).absolute()), "step": state["step"],
            "target": "target/" if target_dir else cfg.target.path, "tokenizer": meta["tokenizer"],
            "chat_template_kwargs": meta["chat_template_kwargs"], "training_config": cfg.to_dict(),
            # a target outside the export is named by path; its weights' digest tells `envkit eval` it is the same
            "target_weights_sha256": weights_digest(Path(cfg.target.path)) if cfg.target.path else None,
            "files": {str(p.relative_to(tmp)): file_sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()},
        }
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        follow_umask(tmp)
        place(tmp, out, force)
    except BaseException:  # SIGTERM too: `python -m trainer export` turns it into an exception
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    target = str(out / "target") if manifest["target"] == "target/" else str(manifest["target"])
    serve = modelcard.serve_commands(target, str(out), cfg.drafter.block_size)
    return {**manifest, "out": str(out), "serve": serve}
