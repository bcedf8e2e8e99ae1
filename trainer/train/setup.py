"""What a run trains with, built once: the target models, the drafter replicas, the data, the mask token.

`build` is the one place a run's pieces are made, for one device or several. Threaded runs call
threadsafe.install() before it, since a Replica compiles its loss when it is built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from trainer.data import corpus

from trainer.data import datasets

from trainer.model import fp8

from trainer.common.errors import TrainerInputError
from trainer.config.schema import TrainConfig, target_layer_ids
from trainer.data import store, store_reader
from trainer.data.storedata import store_datasets
from trainer.model.drafter import build_drafter, pick_attention
from trainer.model.target import build_target, compile_layers, sync_config_from_model
from trainer.targets.locate import tokenizer_source
from trainer.train.replica import Replica


@dataclass
class Setup:
    cfg: TrainConfig
    dtype: torch.dtype
    backend: str  # the drafter's attention: flex or sdpa
    targets: list[nn.Module]  # one frozen target per target device
    replicas: list[Replica]  # one drafter replica per drafter device, bit-identical weights
    layer_ids: list[int]  # the target layers the drafter reads
    mask_token_id: int
    tokenizer_path: str | None
    train_data: datasets.Dataset
    eval_data: datasets.Dataset

    @property
    def target(self) -> nn.Module:
        return self.targets[0]

    @property
    def replica(self) -> Replica:
        return self.replicas[0]

    @property
    def device(self) -> torch.device:
        return self.replica.device

    @property
    def target_device(self) -> torch.device:
        return device_of(self.target)


def device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build(cfg: TrainConfig, *, drafters: list[str | None], targets: list[str | None], log=print) -> Setup:
    """Targets on `targets`, one drafter replica per entry of `drafters` (None: CUDA when there is one)."""
    drafter_devices = [pick_device(d) for d in drafters]
    target_devices = [pick_device(d) for d in targets]
    dtype = getattr(torch, cfg.dtype) if drafter_devices[0].type == "cuda" else torch.float32
    for device in {*drafter_devices, *target_devices}:
        fp8.check_supported(cfg.fp8, device)
    target = build_target(cfg.target, device=target_devices[0], dtype=dtype, log=log)
    if cfg.target.path or cfg.target.recipe:
        sync_config_from_model(cfg.target, target)
    tokenizer = load_tokenizer(cfg)
    mask_token_id = resolve_mask_token(cfg, tokenizer, target.get_input_embeddings().weight.shape[0])
    layer_ids = tapped_layers(cfg)
    torch.manual_seed(cfg.seed)
    backend, attention = pick_attention(cfg, drafter_devices[0])
    drafter = build_drafter(cfg.drafter, cfg.target, len(layer_ids))
    if cfg.fp8 in ("drafter", "both"):
        fp8.convert_drafter(drafter)
    first = Replica(cfg, drafter, drafter_devices[0],
                    target.get_input_embeddings().weight, target.get_output_embeddings().weight, attention, dtype)
    replicas = [first] + [first.clone_to(device) for device in drafter_devices[1:]]
    train_data, eval_data = build_datasets(cfg, tokenizer, target, mask_token_id, log)
    # Further targets after the data: generated data comes from the first, and a random target is rebuilt
    # from its seed, so every target holds the same weights.
    others = [build_target(cfg.target, device=device, dtype=dtype) for device in target_devices[1:]]
    if cfg.fp8 in ("target", "both"):  # after the data: generated data comes from the bf16 target
        converted = sum(fp8.convert_target(model) for model in [target] + others)
        log(f"fp8: {converted} target linears in FP8 (per-channel weight, per-token activation scales)")
    if cfg.compile_target if cfg.compile_target is not None else (cfg.compile and target_devices[0].type == "cuda"):
        compiled = sum(compile_layers(model) for model in [target] + others)
        log(f"compile_target: {compiled} target layers compiled (one graph per bucket shape, shared by every layer)")
    tokenizer_path = str(Path(tokenizer_source(cfg)).absolute()) if tokenizer is not None else None
    return Setup(cfg, dtype, backend, [target] + others, replicas, layer_ids, mask_token_id, tokenizer_path,
                 train_data, eval_data)


def tapped_layers(cfg: TrainConfig) -> list[int]:
    layer_ids = cfg.drafter.target_layer_ids or target_layer_ids(cfg.target.num_layers, cfg.drafter.num_layers)
    if max(layer_ids) >= cfg.target.num_layers or min(layer_ids) < 0:
        raise TrainerInputError(f"target_layer_ids {layer_ids} outside the target's {cfg.target.num_layers} layers")
    return layer_ids


def load_tokenizer(cfg: TrainConfig):
    source = tokenizer_source(cfg)
    if not source:
        return None
    if not Path(source).is_dir():
        raise TrainerInputError(f"tokenizer path {source} is not a directory; give --tokenizer PATH")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source, local_files_only=True)


def resolve_mask_token(cfg: TrainConfig, tokenizer, embedding_rows: int) -> int:
    """The config's; else the tokenizer's; else the first embedding row beyond the tokenizer (Qwen3 has none)."""
    chosen = cfg.target.mask_token_id
    if chosen is None and tokenizer is not None:
        chosen = tokenizer.mask_token_id
        if chosen is None and len(tokenizer) < embedding_rows:
            chosen = len(tokenizer)  # a row no text token uses: the drafter learns it as MASK
        if chosen is None:
            raise TrainerInputError(f"no mask token: the tokenizer has none and all {embedding_rows} embedding rows "
                                    f"are text tokens; set target.mask_token_id in the config or add a mask token "
                                    f"to the tokenizer")
    if chosen is None:
        chosen = cfg.target.vocab_size - 1  # presets reserve the last id
    if not 0 <= chosen < embedding_rows:
        raise TrainerInputError(f"mask_token_id {chosen} is outside the target's {embedding_rows} embedding rows")
    return chosen


def store_data(cfg: TrainConfig, log) -> tuple[datasets.Dataset, datasets.Dataset]:
    """A data file through its token store: prepared on first use (once per node, under a lock), mapped after."""
    prepared = store.prepare(cfg.data.path, tokenizer_dir=tokenizer_source(cfg),
                             template_kwargs=cfg.data.chat_template_kwargs, skip_bad=cfg.data.skip_bad,
                             vocab_size=cfg.target.vocab_size, log=log, progress=store.Progress())
    opened = store_reader.open_store(Path(prepared.store))
    train, eval_data = store_datasets(opened, cfg, cfg.drafter.block_size, prepared.skipped)
    how = "reused" if prepared.reused else f"prepared in {prepared.seconds:.1f}s ({prepared.rows_per_s:,.0f} rows/s)"
    log(f"data: token store {prepared.store} ({how}): {prepared.rows:,} rows, {prepared.tokens:,} tokens, "
        f"{prepared.skipped} malformed lines skipped; {len(train.documents):,} training documents in "
        f"{train.num_rows:,} rows, {len(eval_data.documents)} held-out evaluated; dropped {train.dropped_short} too "
        f"short for one block, truncated {train.truncated} to {cfg.data.buckets[-1]} tokens")
    return train, eval_data


def build_datasets(cfg: TrainConfig, tokenizer, target: nn.Module, mask_token_id: int, log):
    """Training rows (packed unless --no-packing) and held-out sequences (one a row: tau reads them alone)."""
    block = cfg.drafter.block_size
    if cfg.data.path:
        return store_data(cfg, log)
    if cfg.data.source == "corpus":
        if tokenizer is None:
            raise TrainerInputError("data.source corpus needs a tokenizer: a recipe target (--preset code), or "
                                    "--target/--tokenizer PATH")
        started = time.perf_counter()
        device = device_of(target)
        train = datasets.generate(target, cfg.data, cfg.data.num_sequences, mask_token_id, cfg.seed + 1, block, device,
                                  prompts=corpus.prompts(tokenizer, False, cfg.data.num_sequences,
                                                              cfg.data.prompt_len, cfg.seed + 1))
        eval_data = datasets.generate(target, cfg.data, cfg.data.eval_sequences, mask_token_id, cfg.seed + 2, block,
                                      device, prompts=corpus.prompts(tokenizer, True, cfg.data.eval_sequences,
                                                                         cfg.data.prompt_len, cfg.seed + 2))
        log(f"continued {len(train.sequences)} training prompts and {len(eval_data.sequences)} held-out prompts "
            f"from the stdlib corpus with the target in {time.perf_counter() - started:.1f}s")
    elif cfg.data.source == "file":
        raise TrainerInputError(f"the {cfg.preset} preset trains on a data file: give `-- --data FILE.jsonl` (its "
                                f"recipe: the target's answers from `envkit data regenerate`, README)")
    elif cfg.data.source in ("random", "chat_lengths"):
        vocab = cfg.target.vocab_size
        train = datasets.random_tokens(cfg.data, cfg.data.num_sequences, vocab, mask_token_id, cfg.seed + 1, block)
        eval_data = datasets.random_tokens(cfg.data, cfg.data.eval_sequences, vocab, mask_token_id, cfg.seed + 2,
                                           block)
    else:
        started = time.perf_counter()
        device = device_of(target)  # generated on the target's own device
        train = datasets.generate(target, cfg.data, cfg.data.num_sequences, mask_token_id, cfg.seed + 1, block, device)
        eval_data = datasets.generate(target, cfg.data, cfg.data.eval_sequences, mask_token_id, cfg.seed + 2, block,
                                      device)
        log(f"generated {len(train.sequences)} training and {len(eval_data.sequences)} held-out sequences "
            f"from the target in {time.perf_counter() - started:.1f}s")
    if train.dropped_short or train.truncated or train.skipped_bad:
        log(f"data: dropped {train.dropped_short} too short for one block, truncated {train.truncated} "
            f"to {cfg.data.buckets[-1]} tokens, skipped {train.skipped_bad} malformed lines")
    if cfg.data.packing:
        train = datasets.Dataset(train.sequences, cfg.data.buckets, dropped_short=train.dropped_short,
                                 truncated=train.truncated, skipped_bad=train.skipped_bad, packing=True)
        log(f"data: packed {len(train.sequences)} sequences into {train.num_rows} rows")
    return train, eval_data
