"""Typed configs and presets. Checkpoints store the config, so a run can be resumed or evaluated alone."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class TargetConfig:
    path: str | None = None  # local HF model dir; None = build from the fields below with random weights
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6  # the target's; the drafter's norms use it too (the served config says so)
    max_position_embeddings: int = 4096
    # Random targets are near-uniform; scaling the embeddings makes their outputs peaked enough to learn from.
    embedding_scale: float = 1.0
    mask_token_id: int | None = None  # None: the tokenizer's mask token, or the last vocab id for presets
    seed: int = 0


@dataclass
class DrafterConfig:
    num_layers: int = 1
    block_size: int = 16  # B: anchor + B-1 predicted tokens per block
    # Which target layers feed the drafter (0-based decoder layer indices); None = spread evenly.
    target_layer_ids: list[int] | None = None
    intermediate_size: int | None = None  # None: the target's
    gamma: float = 7.0  # loss weight of slot k is exp(-(k-1)/gamma)


@dataclass
class DataConfig:
    path: str | None = None  # JSONL (conversations or input_ids/loss_mask); None = `source`
    # Without a path: "generate" continues prompts with the target (learnable, tiny); "random" draws
    # uniform tokens (a shape-faithful throughput workload: decoding with an 8B target would take hours).
    source: str = "generate"
    # "chat_lengths": uniform tokens with a chat-like length mix, log-normal with this median and 90th
    # percentile (stated as such in bench/RESULTS.md), truncated at the largest bucket.
    length_median: int = 800
    length_p90: int = 2500
    # Several documents in one row of a bucket's length, each isolated (target mask, drafter mask, positions).
    packing: bool = True
    tokenizer: str | None = None  # for conversation JSONL; defaults to the target path
    # Passed to the chat template (e.g. {"enable_thinking": false}): train on what will be served.
    chat_template_kwargs: dict | None = None
    buckets: list[int] = field(default_factory=lambda: [64, 128])  # padded sequence lengths (fixed shapes)
    num_sequences: int = 512  # generated data only
    prompt_len: int = 8  # generated data: random prompt tokens before the target's continuation
    sample_temperature: float = 80.0  # generated data: softmax(temperature x logits)
    ban_recent: int = 32  # generated data: tokens seen in the last N positions are not sampled again
    eval_sequences: int = 32
    skip_bad: bool = False  # count and skip malformed JSONL lines instead of stopping


@dataclass
class TrainConfig:
    preset: str = "tiny"
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    batch_size: int = 8
    num_anchors: int = 16  # blocks per sequence (padding blocks when fewer positions qualify)
    steps: int = 300
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_frac: float = 0.04
    grad_clip: float = 1.0
    dtype: str = "float32"  # bf16 on GPU presets
    attention: str = "auto"  # auto | flex | sdpa (flex has no backward on CPU)
    compile: bool = False  # torch.compile the drafter step (one graph per length bucket)
    lm_head_chunk: int = 2048  # positions per chunk of the fused LM-head cross-entropy
    log_every: int = 10
    eval_every: int = 100
    # The decoding walk at the end of a run (and `eval --walk`): held-out prompts, new tokens per prompt.
    walk_prompts: int = 16
    walk_new_tokens: int = 64
    ckpt_every: int = 100
    seed: int = 0

    def __post_init__(self):
        for name in ("target", "drafter", "data"):
            value = getattr(self, name)
            if isinstance(value, dict):  # loaded from a checkpoint or a JSON config
                setattr(self, name, _build(SECTIONS[name], value, name))
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, not {self.dtype!r}")
        if self.data.source not in ("generate", "random", "chat_lengths"):
            raise ValueError(f"data.source must be generate, random or chat_lengths, not {self.data.source!r}")
        if self.drafter.block_size < 2:
            raise ValueError("drafter.block_size must be at least 2 (an anchor and one predicted token)")
        if self.num_anchors < 1 or self.batch_size < 1:
            raise ValueError("num_anchors and batch_size must be positive")
        if self.attention not in ("auto", "flex", "sdpa"):
            raise ValueError(f"attention must be auto, flex or sdpa, not {self.attention!r}")
        if sorted(self.data.buckets) != self.data.buckets or not self.data.buckets:
            raise ValueError("data.buckets must be a non-empty ascending list of lengths")
        most = self.data.buckets[-1] - self.drafter.block_size + 1
        if self.num_anchors > most:
            raise ValueError(f"num_anchors {self.num_anchors} exceeds the {most} anchor positions of the largest "
                             f"bucket ({self.data.buckets[-1]} tokens, block {self.drafter.block_size}); lower it")
        if self.data.buckets[0] < self.drafter.block_size + 1:
            raise ValueError(f"the smallest bucket ({self.data.buckets[0]}) cannot hold one block of "
                             f"{self.drafter.block_size}")

    def compile_key(self) -> dict:
        """The fields that decide which graphs get compiled: part of the compile cache's env key."""
        return {"target": dataclasses.asdict(self.target), "drafter": dataclasses.asdict(self.drafter),
                "buckets": self.data.buckets, "batch_size": self.batch_size, "num_anchors": self.num_anchors,
                "packing": self.data.packing,
                "dtype": self.dtype, "attention": self.attention, "compile": self.compile,
                "lm_head_chunk": self.lm_head_chunk}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        return _build(cls, data, "config")


def _build(kind, values, where: str):
    """A config dataclass from a dict, naming an unknown key instead of a TypeError."""
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a JSON object, not {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown config key {where}.{unknown[0]}" if where != "config" else
                         f"unknown config key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    return kind(**values)


def _merge(base: dict, override: dict, where: str = "config") -> dict:
    """override's values on top of base's, section by section; a key base lacks is an error naming it."""
    merged = dict(base)
    for key, value in override.items():
        if key not in base:
            raise ValueError(f"unknown config key {where}.{key}" if where != "config" else
                             f"unknown config key {key!r}; known: {', '.join(sorted(base))}")
        merged[key] = _merge(base[key], value, key if where == "config" else f"{where}.{key}") \
            if isinstance(base[key], dict) and isinstance(value, dict) and key in SECTIONS else value
    return merged


def resolve(preset_name: str | None = None, file_values: dict | None = None, overrides: dict | None = None) -> TrainConfig:
    """The config of a run, resolved once: CLI overrides > JSON file > preset (the file's `preset`, else the
    given name, else tiny). A partial file ({"preset": "tiny", "steps": 50}) is that preset with its changes."""
    file_values = file_values or {}
    if not isinstance(file_values, dict):
        raise ValueError(f"a config file must hold a JSON object, not {type(file_values).__name__}")
    name = file_values.get("preset") or preset_name or "tiny"
    merged = _merge(preset(name).to_dict(), file_values)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.rpartition(".")
        merged = _merge(merged, {section: {key: value}} if section else {key: value})
    return TrainConfig.from_dict(merged)


def tiny() -> TrainConfig:
    """2 CPU cores, two minutes, learns something real (DESIGN.md's measured recipe)."""
    return TrainConfig(
        preset="tiny",
        target=TargetConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4,
                            num_kv_heads=2, head_dim=32, embedding_scale=10.0),
        drafter=DrafterConfig(num_layers=1, block_size=8, gamma=4.0),
        data=DataConfig(buckets=[64, 128], num_sequences=512),
        batch_size=8, num_anchors=16, steps=2000, lr=5e-3, log_every=50, eval_every=500, ckpt_every=500,
        compile=True,  # inductor's C++ path on CPU: two buckets, ~35 s cold, ~5 s from a warm cache
    )


def qwen3_8b() -> TrainConfig:
    """Qwen3-8B's real shapes with random weights: a faithful GPU workload that needs no download."""
    return TrainConfig(
        preset="qwen3_8b",
        target=TargetConfig(vocab_size=151_936, hidden_size=4096, intermediate_size=12_288, num_layers=36,
                            num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=40_960,
                            embedding_scale=1.0),
        drafter=DrafterConfig(num_layers=5, block_size=16, gamma=7.0),
        data=DataConfig(buckets=[1024, 2048, 3072], num_sequences=64, prompt_len=64, eval_sequences=4,
                        source="random"),
        batch_size=1, num_anchors=512, steps=100, lr=6e-4, dtype="bfloat16", attention="auto", compile=True,
        log_every=5, eval_every=0, ckpt_every=0,
    )


PRESETS = {"tiny": tiny, "qwen3_8b": qwen3_8b}
SECTIONS = {"target": TargetConfig, "drafter": DrafterConfig, "data": DataConfig}


def preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()


def target_layer_ids(num_target_layers: int, num_drafter_layers: int) -> list[int]:
    """One tapped layer per drafter layer, spread evenly from layer 1 to num_target_layers - 3."""
    if num_drafter_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end <= start:
        raise ValueError(f"a {num_target_layers}-layer target has no room for {num_drafter_layers} tapped layers")
    span = end - start
    return [round(start + i * span / (num_drafter_layers - 1)) for i in range(num_drafter_layers)]
