"""Where a run's target and tokenizer live on disk, without importing torch (`trainer prepare` needs only that)."""

from __future__ import annotations

from trainer.config.schema import TargetConfig, TrainConfig
from trainer.targets import maketarget, pretrained


def target_dir(cfg: TargetConfig, log=print) -> str | None:
    """The target's model dir: the configured path, or a recipe's built target (built here on first use);
    None for a random target."""
    if cfg.path:
        return cfg.path
    if cfg.recipe in pretrained.PRETRAINED:
        return str(pretrained.find(cfg.recipe))
    if cfg.recipe:
        return str(maketarget.ensure(cfg.recipe, cfg.seed, log=log))
    return None


def tokenizer_source(cfg: TrainConfig) -> str | None:
    """--tokenizer; else the target's own dir when the data is text (a file, or the corpus)."""
    if cfg.data.tokenizer:
        return cfg.data.tokenizer
    return target_dir(cfg.target) if cfg.data.path or cfg.data.source == "corpus" else None
