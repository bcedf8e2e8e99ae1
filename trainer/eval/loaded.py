"""A trained drafter and its target, loaded to be evaluated: from a run's checkpoint, or from an export as a
serving engine loads it (its model.safetensors, config.json and envkit-export.json), never from the checkpoint
behind the export. No training data is read: an evaluation needs the prompts it is given and nothing else."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.common.errors import TrainerInputError
from trainer.common.files import weights_digest
from trainer.common.records import EXPORT_MANIFEST
from trainer.config.schema import TrainConfig
from trainer.model.drafter import EVAL_ATTENTION, Drafter, build_drafter
from trainer.model.target import build_target, sync_config_from_model
from trainer.targets.locate import target_dir
from trainer.train.setup import pick_device, resolve_mask_token

# What a target must share with the one a drafter was trained against: the drafter's weights are shaped by them.
TARGET_SHAPE = (("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"),
                ("num_hidden_layers", "num_target_layers"), ("num_attention_heads", "num_attention_heads"),
                ("num_key_value_heads", "num_key_value_heads"))


@dataclass
class Loaded:
    cfg: TrainConfig
    target: torch.nn.Module
    drafter: Drafter
    layer_ids: list[int]
    mask_token_id: int
    dtype: torch.dtype  # what the drafter and target compute in (bf16 on CUDA, float32 on CPU)
    tokenizer_dir: str | None
    source: str  # "checkpoint" or "export"
    step: int | None  # the training step the weights are from

    def proposer(self):
        from trainer.eval.walk import DrafterProposer

        return DrafterProposer(self.drafter, EVAL_ATTENTION, self.target.get_input_embeddings().weight,
                               self.target.get_output_embeddings().weight, self.mask_token_id, self.dtype)


def from_checkpoint(ckpt: Path, target: str | None, device: str | None) -> Loaded:
    from trainer.train import checkpoint

    state = checkpoint.load(ckpt)
    cfg = TrainConfig.from_dict(state["config"])
    if target:
        cfg.target.path = target
    return _load(cfg, state["drafter"], list(state["layer_ids"]), state["mask_token_id"], device, "checkpoint",
                 state.get("step"))


def from_export(export: Path, target: str | None, device: str | None) -> Loaded:
    from safetensors.torch import load_file

    manifest, config = _read_json(export / EXPORT_MANIFEST), _read_json(export / "config.json")
    try:
        cfg = TrainConfig.from_dict(manifest["training_config"])
        dflash = config["dflash_config"]
        layer_ids, mask_token_id = [int(i) for i in dflash["target_layer_ids"]], int(dflash["mask_token_id"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainerInputError(f"{export} is not an envkit export ({exc!s:.80} missing or malformed); evaluate a "
                                f"directory `envkit export` wrote") from None
    bundled = export / "target"
    chosen = target or (str(bundled) if bundled.is_dir() else manifest.get("target"))
    if not isinstance(chosen, str) or not Path(chosen).is_dir():
        raise TrainerInputError(f"the export's target {str(chosen)[:200]!r} is not a directory here; give --target DIR")
    check_target(Path(chosen), config, manifest, bundled)
    cfg.target.path, cfg.target.recipe = chosen, None
    if not cfg.data.tokenizer and not (Path(chosen) / "tokenizer_config.json").exists() \
            and (export / "tokenizer_config.json").exists():
        cfg.data.tokenizer = str(export)  # the tokenizer export saved beside the drafter
    weights = load_file(str(export / "model.safetensors"))
    step = manifest.get("step")
    return _load(cfg, weights, layer_ids, mask_token_id, device, "export", step if isinstance(step, int) else None)


def check_target(chosen: Path, config: dict, manifest: dict, bundled: Path) -> None:
    """The target given is the one the export was trained against: its shape always, its weights by digest
    where the export recorded one (a bundled target/ is the export's own)."""
    given = _read_json(chosen / "config.json")
    for theirs, ours in TARGET_SHAPE:
        if theirs in given and ours in config and given[theirs] != config[ours]:
            raise TrainerInputError(f"--target {chosen} is not the target this export was trained against: its "
                                    f"{theirs} is {given[theirs]}, the drafter's target had {config[ours]}")
    recorded = manifest.get("target_weights_sha256")
    if isinstance(recorded, str) and chosen.resolve() != bundled.resolve() and weights_digest(chosen) != recorded:
        raise TrainerInputError(f"--target {chosen} is not the target this export was trained against: its weights "
                                f"differ (sha256 {weights_digest(chosen)[:12]}, the export recorded {recorded[:12]})")


def _load(cfg: TrainConfig, weights: dict, layer_ids: list[int], mask_token_id: int, device: str | None,
          source: str, step: int | None) -> Loaded:
    from trainer.train.setup import load_tokenizer

    chosen = pick_device(device)
    dtype = getattr(torch, cfg.dtype) if chosen.type == "cuda" else torch.float32
    cfg.attention, cfg.compile = "sdpa", False
    target = build_target(cfg.target, device=chosen, dtype=dtype)
    if cfg.target.path or cfg.target.recipe:
        sync_config_from_model(cfg.target, target)
    if max(layer_ids, default=-1) >= cfg.target.num_layers:
        raise TrainerInputError(f"the drafter reads target layers {layer_ids}; the target has {cfg.target.num_layers}")
    embedding_rows = target.get_input_embeddings().weight.shape[0]
    if not 0 <= mask_token_id < embedding_rows:
        raise TrainerInputError(f"mask_token_id {mask_token_id} is outside the target's {embedding_rows} embeddings")
    tokenizer = load_tokenizer(cfg)
    cfg.target.mask_token_id = mask_token_id
    resolve_mask_token(cfg, tokenizer, embedding_rows)  # the same range check training made
    drafter = build_drafter(cfg.drafter, cfg.target, len(layer_ids))
    try:
        drafter.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    except RuntimeError as exc:
        raise TrainerInputError(f"the drafter's weights do not fit its config ({str(exc).splitlines()[0][:160]})") from None
    drafter.to(chosen).eval().requires_grad_(False)
    tokenizer_dir = cfg.data.tokenizer or target_dir(cfg.target)
    return Loaded(cfg, target, drafter, layer_ids, mask_token_id, dtype,
                  tokenizer_dir if tokenizer is not None or _has_tokenizer(tokenizer_dir) else None, source, step)


def _has_tokenizer(directory: str | None) -> bool:
    return bool(directory) and (Path(directory) / "tokenizer_config.json").exists()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TrainerInputError(f"{path} is missing; evaluate a run dir, or a directory `envkit export` wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrainerInputError(f"{path} cannot be read as JSON ({exc!s:.80})") from None
    if not isinstance(data, dict):
        raise TrainerInputError(f"{path} is not a JSON object")
    return data
