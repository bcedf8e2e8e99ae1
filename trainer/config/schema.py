"""Typed configs and presets. Checkpoints store the config, so a run can be resumed or evaluated alone."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from trainer.config import PRESET_SUMMARIES
from trainer.common.errors import TrainerInputError


@dataclass
class TargetConfig:
    path: str | None = None  # local HF model dir; None = `recipe`, else the fields below with random weights
    # A target trained here on the stdlib sources (trainer/targets/maketarget.py: code_tiny, code_small), built on first
    # use into ENVKIT_HOME/targets and reused; the fields below must match its architecture.
    recipe: str | None = None
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
    seed: int = 0  # a random target's weights; a recipe's build (0: the recipe as shipped, another its own dir)


@dataclass
class DrafterConfig:
    num_layers: int = 1
    block_size: int = 16  # B: anchor + B-1 predicted tokens per block
    # Which target layers feed the drafter (0-based decoder layer indices); None = spread evenly.
    target_layer_ids: list[int] | None = None
    intermediate_size: int | None = None  # None: the target's
    gamma: float = 7.0  # loss weight of slot k is exp(-(k-1)/gamma)
    # "target": the tapped states (DFlash). "zeros": the same shapes, all zero, in training and the walk: the
    # ablation that shows how much of the acceptance comes from the target's features.
    context: str = "target"


@dataclass
class DataConfig:
    # JSONL (conversations, {"text": ...} or input_ids/loss_mask) or a plain text file; None = `source`
    path: str | None = None
    # Without a path: "generate" continues random prompts with the target (learnable, tiny); "corpus" continues
    # prompts cut from the stdlib corpus with the target (training files for training, held-out files for
    # evaluation: the data DFlash trains on, for a `recipe` target); "random" draws uniform tokens (a
    # shape-faithful throughput workload: decoding with an 8B target would take hours); "file": only a data file
    # (`--data`), such as the target's regenerated answers.
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
    greedy: bool = False  # generated data: the target's argmax, as greedy serving verifies (no sampling, no ban)
    eval_sequences: int = 32
    skip_bad: bool = False  # count and skip malformed JSONL lines instead of stopping
    # A data file's held-out rows: those whose content hash falls below this fraction (appending rows never
    # moves them; with so few rows that none does, the row of smallest hash). Never trained on.
    heldout_fraction: float = 0.02


@dataclass
class TrainConfig:
    preset: str = "tiny"
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    batch_size: int = 8
    num_anchors: int = 16  # blocks per sequence (padding blocks when fewer positions qualify)
    steps: int = 300
    # Passes over the training rows; when set, the steps are derived from it (an explicit --steps wins).
    epochs: int | None = None
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_frac: float = 0.04
    grad_clip: float = 1.0
    dtype: str = "float32"  # bf16 on GPU presets
    attention: str = "auto"  # auto | flex | sdpa (flex has no backward on CPU)
    compile: bool = False  # torch.compile the drafter step (one graph per length bucket)
    lm_head_chunk: int = 2048  # positions per chunk of the fused LM-head cross-entropy
    # FP8 linears (Hopper): off | target (the frozen target's decoder linears) | drafter (torchao float8
    # training) | both. Refused where the device has no FP8 matmuls (trainer/model/fp8.py).
    fp8: str = "off"
    # AdamW's fused CUDA kernel (one launch for every parameter); None: fused on CUDA, the foreach path elsewhere.
    fused_optimizer: bool | None = None
    # The frozen target's decoder layers compiled (one graph per bucket shape, shared by every layer) for the
    # tapped forwards of training; None: on where `compile` is on and the target is on CUDA.
    compile_target: bool | None = None
    log_every: int = 10
    eval_every: int = 100
    # The decoding walk at the end of a run (and `eval --walk`): held-out prompts, new tokens per prompt.
    walk_prompts: int = 16
    walk_new_tokens: int = 64
    # Prompt files walked too at the end of a run, each reported on its own in the summary (`walk_by_file`): one
    # kind of traffic each, e.g. `envkit data mix`'s held-out file per source (the first walk_prompts of each).
    walk_files: list[str] = field(default_factory=list)
    ckpt_every: int = 100
    seed: int = 0

    def __post_init__(self):
        for name in ("target", "drafter", "data"):
            value = getattr(self, name)
            if isinstance(value, dict):  # loaded from a checkpoint or a JSON config
                setattr(self, name, _build(SECTIONS[name], value, name))
        for where, section in (("", self), ("target.", self.target), ("drafter.", self.drafter), ("data.", self.data)):
            _check_fields(section, where)
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise TrainerInputError(f"dtype must be float32, bfloat16 or float16, not {self.dtype!r}")
        if self.data.source not in ("generate", "corpus", "random", "chat_lengths", "file"):
            raise TrainerInputError(f"data.source must be generate, corpus, random, chat_lengths or file, not "
                                    f"{self.data.source!r}")
        if self.drafter.context not in ("target", "zeros"):
            raise TrainerInputError(f"drafter.context must be target or zeros, not {self.drafter.context!r}")
        if self.drafter.block_size < 2:
            raise TrainerInputError("drafter.block_size must be at least 2 (an anchor and one predicted token)")
        if self.num_anchors < 1 or self.batch_size < 1:
            raise TrainerInputError("num_anchors and batch_size must be positive")
        if self.fp8 not in ("off", "target", "drafter", "both"):
            raise TrainerInputError(f"fp8 must be off, target, drafter or both, not {self.fp8!r}")
        if self.attention not in ("auto", "flex", "sdpa"):
            raise TrainerInputError(f"attention must be auto, flex or sdpa, not {self.attention!r}")
        if sorted(self.data.buckets) != self.data.buckets or not self.data.buckets:
            raise TrainerInputError("data.buckets must be a non-empty ascending list of lengths")
        most = self.data.buckets[-1] - self.drafter.block_size + 1
        if self.num_anchors > most:
            raise TrainerInputError(f"num_anchors {self.num_anchors} exceeds the {most} anchor positions of the largest "
                             f"bucket ({self.data.buckets[-1]} tokens, block {self.drafter.block_size}); lower it")
        if self.data.length_p90 < self.data.length_median:
            raise TrainerInputError("data.length_p90 must be at least data.length_median")
        if self.data.buckets[0] < self.drafter.block_size + 1:
            raise TrainerInputError(f"the smallest bucket ({self.data.buckets[0]}) cannot hold one block of "
                             f"{self.drafter.block_size}")

    def compile_key(self) -> dict:
        """The fields that decide which graphs get compiled: part of the compile cache's env key."""
        return {"target": dataclasses.asdict(self.target), "drafter": dataclasses.asdict(self.drafter),
                "buckets": self.data.buckets, "batch_size": self.batch_size, "num_anchors": self.num_anchors,
                "packing": self.data.packing,
                "dtype": self.dtype, "attention": self.attention, "compile": self.compile,
                "lm_head_chunk": self.lm_head_chunk, "fp8": self.fp8, "compile_target": self.compile_target}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        return _build(cls, data, "config")


POSITIVE = (0, None, True)  # greater than zero
# Bounds of numeric fields, (low, high[, low excluded]), inclusive unless marked; a value outside is refused where the config is read,
# not found at step 547 (gamma 0 trains NaN, a negative grad_clip trains uphill, walk_prompts 0 reports 0).
BOUNDS = {
    "batch_size": (1, None), "num_anchors": (1, None), "steps": (1, None), "lm_head_chunk": (1, None),
    "log_every": (1, None), "eval_every": (0, None), "ckpt_every": (0, None), "walk_prompts": (1, None),
    "walk_new_tokens": (1, None), "lr": POSITIVE, "weight_decay": (0, None), "warmup_frac": (0, 0.999),
    "grad_clip": POSITIVE, "seed": (0, None),
    "target.vocab_size": (2, None), "target.hidden_size": (1, None), "target.intermediate_size": (1, None),
    "target.num_layers": (1, None), "target.num_heads": (1, None), "target.num_kv_heads": (1, None),
    "target.head_dim": (1, None), "target.rope_theta": POSITIVE, "target.rms_norm_eps": (0, 1.0, True),
    "target.max_position_embeddings": (1, None), "target.embedding_scale": POSITIVE, "target.mask_token_id": (0, None),
    "target.seed": (0, None),
    "drafter.num_layers": (1, None), "drafter.intermediate_size": (1, None), "drafter.gamma": POSITIVE,
    "data.length_median": (1, None), "data.length_p90": (1, None), "data.num_sequences": (1, None),
    "data.prompt_len": (1, None), "data.sample_temperature": POSITIVE, "data.ban_recent": (0, None),
    "data.eval_sequences": (1, None), "data.heldout_fraction": (0, 0.5, True), "epochs": (1, None),
}
LIST_MINIMUM = {"data.buckets": 2, "drafter.target_layer_ids": 0}  # lengths hold a token; layer ids count from 0
_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,), "list[int]": (list,),
          "list[str]": (list,)}


def _check_fields(section, where: str) -> None:
    """Every field has its declared type (8.5 is no batch size, "4" no step count) and lies within BOUNDS."""
    for spec in dataclasses.fields(section):
        value, name = getattr(section, spec.name), where + spec.name
        kinds = [k.strip() for k in str(spec.type).split("|")]
        if value is None and "None" in kinds:
            continue
        allowed = tuple(t for k in kinds for t in _TYPES.get(k, (object,)))
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise TrainerInputError(f"config {name} must be {' or '.join(kinds)}, not {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise TrainerInputError(f"config {name} must be a finite number, not {value!r}")
        least = LIST_MINIMUM.get(name, 0)
        if isinstance(value, list) and "list[str]" in kinds:
            if not all(isinstance(v, str) and v for v in value):
                raise TrainerInputError(f"config {name} must be a list of paths, not {value!r:.200}")
        elif isinstance(value, list) and not all(isinstance(v, int) and not isinstance(v, bool) and v >= least
                                               for v in value):
            raise TrainerInputError(f"config {name} must be a list of whole numbers of at least {least}, not {value!r}")
        low, high, *excluded = BOUNDS.get(name, (None, None))
        if (low is not None and (value <= low if excluded else value < low)) or (high is not None and value > high):
            bound = ("greater than" if excluded else "at least") + f" {low}" + (f" and at most {high}" if high else "")
            raise TrainerInputError(f"config {name} must be {bound}, not {value!r}")


def _build(kind, values, where: str):
    """A config dataclass from a dict, naming an unknown key instead of a TypeError."""
    if not isinstance(values, dict):
        raise TrainerInputError(f"{where} must be a JSON object, not {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainerInputError(f"unknown config key {where}.{unknown[0]}" if where != "config" else
                         f"unknown config key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    return kind(**values)


def _merge(base: dict, override: dict, where: str = "config") -> dict:
    """override's values on top of base's, section by section; a key base lacks is an error naming it."""
    merged = dict(base)
    for key, value in override.items():
        if key not in base:
            raise TrainerInputError(f"unknown config key {where}.{key}" if where != "config" else
                             f"unknown config key {key!r}; known: {', '.join(sorted(base))}")
        merged[key] = _merge(base[key], value, key if where == "config" else f"{where}.{key}") \
            if isinstance(base[key], dict) and isinstance(value, dict) and key in SECTIONS else value
    return merged


def resolve(preset_name: str | None = None, file_values: dict | None = None, overrides: dict | None = None) -> TrainConfig:
    """The config of a run, resolved once: CLI overrides > JSON file > preset (the file's `preset`, else the
    given name, else tiny). A partial file ({"preset": "tiny", "steps": 50}) is that preset with its changes."""
    file_values, overrides = file_values or {}, overrides or {}
    if not isinstance(file_values, dict):
        raise TrainerInputError(f"a config file must hold a JSON object, not {type(file_values).__name__}")
    name = file_values.get("preset") or preset_name or "tiny"
    merged = _merge(preset(name).to_dict(), file_values)
    for dotted, value in overrides.items():
        section, _, key = dotted.rpartition(".")
        merged = _merge(merged, {section: {key: value}} if section else {key: value})
    # A step count wins over passes over the data asked for below it (a preset's, a file's), and on the command line
    # over --epochs too; a file with both (a run's config.json) keeps the epochs its steps came from.
    if "steps" in overrides or ("epochs" not in overrides and "steps" in file_values and "epochs" not in file_values):
        merged["epochs"] = None
    return TrainConfig.from_dict(merged)


def tiny() -> TrainConfig:
    """2 CPU cores, two minutes, learns something real (DESIGN.md's measured recipe)."""
    return TrainConfig(
        preset="tiny",
        target=TargetConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4,
                            num_kv_heads=2, head_dim=32, embedding_scale=10.0),
        drafter=DrafterConfig(num_layers=1, block_size=8, gamma=4.0),
        # One bucket: 16% padding where two gave 9%, but each bucket costs ~20 s of
        # cold compile and ~4 s of warm-up; the code preset keeps two.
        data=DataConfig(buckets=[128], num_sequences=512),
        # 1,000 steps: the walk's tau is ~2.1 against copy's 1.45 (2,000 steps gave 2.31 for another minute).
        batch_size=8, num_anchors=16, steps=1000, lr=5e-3, log_every=50, eval_every=500, ckpt_every=500,
        compile=True,  # inductor's C++ path on CPU: ~45 s cold, ~6 s from a warm cache
    )


def code() -> TrainConfig:
    """A drafter for a target that has learned something: code_tiny, trained here on the stdlib sources (built
    the first time, about a minute), continuing prompts cut from its training files; the walk runs on
    prompts from held-out files."""
    return TrainConfig(
        preset="code",
        target=TargetConfig(recipe="code_tiny", vocab_size=1024, hidden_size=128, intermediate_size=384,
                            num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32),
        drafter=DrafterConfig(num_layers=1, block_size=8, gamma=4.0),
        data=DataConfig(source="corpus", buckets=[64, 128], num_sequences=2048, prompt_len=32, greedy=True,
                        eval_sequences=32),
        batch_size=8, num_anchors=16, steps=1500, lr=5e-3, log_every=50, eval_every=500, ckpt_every=500,
        compile=True,
    )


def chat() -> TrainConfig:
    """A pretrained instruct target, SmolLM2-135M-Instruct (fetched and converted once: `envkit target fetch
    chat`), trained on its own regenerated answers to instructions (`-- --data REGENERATED.jsonl`, conversations:
    loss on the assistant's tokens through its chat template); walk on held-out instructions with `eval --walk
    --prompts`. The shapes below are the target's own, read from it. The drafter is the measured recipe
    (bench/RESULTS.md): 4 drafter layers walk 1.62x the copy rule on an H100 where 2 layers walked 1.39x. The steps
    follow from the data: 3 passes over the answers (51,453 mixed answers: 6,339 steps of 16 rows; `--steps` wins)."""
    return TrainConfig(
        preset="chat",
        target=TargetConfig(recipe="smollm2_135m_instruct", vocab_size=49_152, hidden_size=576,
                            intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                            rope_theta=100_000.0, max_position_embeddings=8192, embedding_scale=1.0,
                            mask_token_id=16),  # <empty_output>: a Jupyter token no conversation holds
        drafter=DrafterConfig(num_layers=4, block_size=8, gamma=4.0),
        data=DataConfig(source="file", buckets=[256, 512], eval_sequences=32),
        batch_size=16, num_anchors=32, epochs=3, lr=1e-3, dtype="bfloat16",  # bf16 on a GPU, as measured
        log_every=25, eval_every=500, ckpt_every=500, walk_prompts=32, walk_new_tokens=64, compile=True,
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


PRESETS = {"tiny": tiny, "code": code, "chat": chat, "qwen3_8b": qwen3_8b}
assert set(PRESETS) == set(PRESET_SUMMARIES), "every preset has its line of help (trainer/config/__init__.py)"
SECTIONS = {"target": TargetConfig, "drafter": DrafterConfig, "data": DataConfig}


def preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise TrainerInputError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()


def target_layer_ids(num_target_layers: int, num_drafter_layers: int) -> list[int]:
    """One tapped layer per drafter layer, spread evenly from layer 1 to num_target_layers - 3."""
    if num_drafter_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end <= start:
        raise TrainerInputError(f"a {num_target_layers}-layer target has no room for {num_drafter_layers} tapped layers")
    span = end - start
    return [round(start + i * span / (num_drafter_layers - 1)) for i in range(num_drafter_layers)]
