"""The training loop: one object with train(), step(), evaluate(), warmup(), state_dict() and close()."""

from __future__ import annotations

import functools
import json
import random
import resource
import threading
import time
from pathlib import Path

import torch

from trainer import checkpoint, data as datasets, evaluate, walk
from trainer.board import Board
from trainer.config import TrainConfig, target_layer_ids
from trainer.export import weights_checksum
from trainer.loss import block_targets, sample_anchors
from trainer.model import BACKENDS, build_drafter
from trainer.replica import Replica
from trainer.monitor import CompileMonitor, inductor_cache_counters
from trainer.target import TrainerInputError, build_target, sync_config_from_model, tapped_states

CHECKPOINT = "checkpoint.pt"


class Interrupted(Exception):
    """SIGINT or SIGTERM took effect at a step boundary: the state is that of the steps completed."""


def to_device(tensors: tuple, device: torch.device) -> tuple:
    return tuple(t.to(device, non_blocking=True) for t in tensors)


def pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_attention(cfg: TrainConfig, device: torch.device):
    backend = cfg.attention
    if backend == "auto":
        backend = "flex" if device.type == "cuda" else "sdpa"
    if backend == "flex" and device.type == "cpu":
        raise TrainerInputError("flex_attention has no backward on CPU (HAZARDS.md H7); use --attention sdpa")
    return backend, BACKENDS[backend]


def _resolve_mask_token(cfg: TrainConfig, tokenizer, embedding_rows: int) -> int:
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


def throughput(positions: int, useful: int, seconds: float) -> dict:
    """tokens_per_s counts every position processed, padding included; useful_tokens_per_s only real tokens."""
    return {"tokens_per_s": round(positions / seconds, 1), "useful_tokens_per_s": round(useful / seconds, 1),
            "pad_fraction": round(1 - useful / positions, 4) if positions else 0.0}


def work_stats(batch: dict, anchors: torch.Tensor) -> dict:
    """What a step really computed, for useful-token FLOPs: the sum of squared document lengths (the
    target's block-diagonal attention) and the anchors placed."""
    docs = batch["doc_ids"]
    counts = [torch.bincount(row[row >= 0]) for row in docs]
    return {"doc_tokens_sq": int(sum(int((c * c).sum()) for c in counts)), "anchors": int((anchors >= 0).sum())}


def _peak_memory(device: torch.device) -> int:
    """Peak since the last call on CUDA (a per-step peak shows whether memory is flat); process peak RSS on CPU."""
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class Trainer:
    def __init__(self, cfg: TrainConfig, out_dir: str | Path, *, device: str | None = None,
                 target_device: str | None = None, resume: bool = False, log=print):
        self.cfg, self.log = cfg, log
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.device = pick_device(device)
        self.target_device = pick_device(target_device) if target_device else self.device
        self.dtype = getattr(torch, cfg.dtype) if self.device.type == "cuda" else torch.float32
        self.target = build_target(cfg.target, device=self.target_device, dtype=self.dtype)
        if cfg.target.path:
            sync_config_from_model(cfg.target, self.target)
        tokenizer = self._tokenizer()
        self.tokenizer_path = str(Path(self._tokenizer_source()).absolute()) if tokenizer is not None else None
        self.mask_token_id = _resolve_mask_token(cfg, tokenizer, self.target.get_input_embeddings().weight.shape[0])
        self.layer_ids = cfg.drafter.target_layer_ids or target_layer_ids(cfg.target.num_layers, cfg.drafter.num_layers)
        if max(self.layer_ids) >= cfg.target.num_layers or min(self.layer_ids) < 0:
            raise TrainerInputError(f"target_layer_ids {self.layer_ids} outside the target's {cfg.target.num_layers} layers")
        torch.manual_seed(cfg.seed)
        self.backend, attention = pick_attention(cfg, self.device)
        drafter = build_drafter(cfg.drafter, cfg.target, len(self.layer_ids))
        self.replica = Replica(cfg, drafter, self.device, self.target.get_input_embeddings().weight,
                               self.target.get_output_embeddings().weight, attention, self.dtype)
        self.train_data, self.eval_data = self._datasets(tokenizer)
        self.monitor = CompileMonitor()
        self.step_count = 0
        self.first_loss: float | None = None
        self.recent_losses: list[float] = []  # the summary's end loss is their mean: one batch is noisy
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self._metrics = None
        # Signals only set this; the loop stops at the next step boundary, so a checkpoint never holds
        # step s+1's weights labelled step s.
        self.interrupt = threading.Event()
        self._in_step = False
        if resume:
            self.load_state_dict(checkpoint.load(self.out_dir / CHECKPOINT))
            self.log(f"resumed from {self.out_dir / CHECKPOINT} at step {self.step_count}")

    # -- set-up -----------------------------------------------------------------------------------
    def _tokenizer_source(self) -> str | None:
        return self.cfg.data.tokenizer or (self.cfg.target.path if self.cfg.data.path else None)

    def _tokenizer(self):
        source = self._tokenizer_source()
        if not source:
            return None
        if not Path(source).is_dir():
            raise TrainerInputError(f"tokenizer path {source} is not a directory; give --tokenizer PATH")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source)

    def _datasets(self, tokenizer):
        cfg, block = self.cfg, self.cfg.drafter.block_size
        if cfg.data.path:
            train = datasets.load_jsonl(cfg.data.path, cfg.data, block, tokenizer)
            # Hold out the last few sequences for tau.
            held = max(1, min(cfg.data.eval_sequences, len(train.sequences) // 10))
            eval_data = datasets.Dataset(train.sequences[-held:], cfg.data.buckets)
            train = datasets.Dataset(train.sequences[:-held] or train.sequences, cfg.data.buckets,
                                     dropped_short=train.dropped_short, truncated=train.truncated,
                                     skipped_bad=train.skipped_bad)
        elif cfg.data.source in ("random", "chat_lengths"):
            vocab = cfg.target.vocab_size
            train = datasets.random_tokens(cfg.data, cfg.data.num_sequences, vocab, self.mask_token_id, cfg.seed + 1,
                                           block)
            eval_data = datasets.random_tokens(cfg.data, cfg.data.eval_sequences, vocab, self.mask_token_id,
                                               cfg.seed + 2, block)
        else:
            started = time.perf_counter()
            train = datasets.generate(self.target, cfg.data, cfg.data.num_sequences, self.mask_token_id,
                                      cfg.seed + 1, block, self.target_device)
            eval_data = datasets.generate(self.target, cfg.data, cfg.data.eval_sequences, self.mask_token_id,
                                          cfg.seed + 2, block, self.target_device)
            self.log(f"generated {len(train.sequences)} training and {len(eval_data.sequences)} held-out sequences "
                     f"from the target in {time.perf_counter() - started:.1f}s")
        if train.dropped_short or train.truncated or train.skipped_bad:
            self.log(f"data: dropped {train.dropped_short} too short for one block, truncated {train.truncated} "
                     f"to {cfg.data.buckets[-1]} tokens, skipped {train.skipped_bad} malformed lines")
        if cfg.data.packing:  # held-out data stays one sequence a row: tau and the walk read documents alone
            train = datasets.Dataset(train.sequences, cfg.data.buckets, dropped_short=train.dropped_short,
                                     truncated=train.truncated, skipped_bad=train.skipped_bad, packing=True)
            self.log(f"data: packed {len(train.sequences)} sequences into {len(train.rows)} rows")
        return train, eval_data

    def _prepare(self, batch: dict, generator: torch.Generator, target_model=None):
        """Anchors, the target's tapped states and the block tensors of a batch, on the target's device."""
        cfg = self.cfg
        target_model = target_model or self.target
        target_device = next(target_model.parameters()).device
        anchors = sample_anchors(batch["loss_mask"], batch["lengths"], cfg.num_anchors, cfg.drafter.block_size,
                                 generator, batch["doc_ids"])
        batch = {k: v.to(target_device, non_blocking=True) for k, v in batch.items()}
        anchors = anchors.to(target_device, non_blocking=True)
        if cfg.data.packing:  # documents attend within themselves, positions restarting (block-diagonal causal)
            # On CUDA through flex over a document BlockMask: the blocks between documents are skipped.
            doc_ids = batch["doc_ids"] if target_device.type == "cuda" else None
            tapped = tapped_states(target_model, batch["input_ids"], None, self.layer_ids, batch["positions"], doc_ids)
        else:
            tapped = tapped_states(target_model, batch["input_ids"], batch["attention_mask"], self.layer_ids)
        block_ids, labels, weights = block_targets(batch["input_ids"], batch["loss_mask"], batch["lengths"], anchors,
                                                   cfg.drafter.block_size, cfg.drafter.gamma, self.mask_token_id)
        return tapped, block_ids, anchors, labels, weights, batch["positions"], batch["doc_ids"]

    def request_stop(self) -> bool:
        """From a signal handler: stop at the next step boundary. False when no step is under way (stop now)."""
        self.interrupt.set()
        return self.busy()

    def busy(self) -> bool:
        return self._in_step

    def step(self) -> dict:
        """One optimizer step on the batch of `step_count`; returns the metrics row."""
        self._in_step = True
        try:
            return self._step()
        finally:
            self._in_step = False

    def _step(self) -> dict:
        cfg = self.cfg
        started = time.perf_counter()
        batch = self.train_data.batch(self.step_count, cfg.batch_size, cfg.seed)
        generator = torch.Generator().manual_seed(cfg.seed * 7_919 + self.step_count)
        replica = self.replica
        replica.drafter.train()
        inputs = self._prepare(batch, generator)
        loss = replica.loss_fn(*to_device(inputs, replica.device))
        loss.backward()
        replica.apply_gradients()
        self.step_count += 1
        loss_value = float(loss.detach())  # host sync: once per step, the loss is logged every step
        seconds = time.perf_counter() - started
        row = {"step": self.step_count, "loss": round(loss_value, 5),
               **throughput(int(batch["input_ids"].numel()), int(batch["lengths"].sum()), seconds),
               **work_stats(batch, inputs[2]),
               "lr": replica.scheduler.get_last_lr()[0], "peak_mem_bytes": _peak_memory(self.device),
               "bucket": int(batch["input_ids"].shape[1]), **self.monitor.since_warm()}
        if self.first_loss is None:
            self.first_loss = loss_value
        self.recent_losses = (self.recent_losses + [loss_value])[-self.cfg.log_every:]
        return row

    # -- warm-up, eval, train ---------------------------------------------------------------------
    def warmup(self, progress=None, buckets: list[int] | None = None) -> list[int]:
        """Compile every length bucket (or those given), forward and backward, single-threaded."""
        generator = torch.Generator().manual_seed(0)
        buckets = self.cfg.data.buckets if buckets is None else buckets
        for index, bucket in enumerate(buckets):
            batch = self.train_data.bucket_batch(bucket, self.cfg.batch_size)
            inputs = self._prepare(batch, generator)
            for replica in self.replicas:
                replica.loss_fn(*to_device(inputs, replica.device)).backward()
                replica.optimizer.zero_grad(set_to_none=True)
            if progress:
                progress(index + 1, len(buckets), bucket)
        self.monitor.mark_warm()
        return list(buckets)

    def evaluate(self) -> dict:
        with self.monitor.excluding():
            return self._evaluate()

    @torch.no_grad()
    def _evaluate(self) -> dict:
        cfg = self.cfg
        replica = self.replica
        replica.drafter.eval()
        generator = torch.Generator().manual_seed(12_345)  # the same positions at every eval
        scores = {"drafter": [], "repeat": [], "copy": []}
        for bucket, members in sorted(self.eval_data.by_bucket.items()):
            for start in range(0, len(members), cfg.batch_size):
                rows = [self.eval_data.row(i) for i in members[start:start + cfg.batch_size]]
                batch = datasets.collate(rows, bucket)
                tapped, block_ids, anchors, _labels, _weights, positions, doc_ids = to_device(
                    self._prepare(batch, generator), replica.device)
                draft = replica.draft(tapped, block_ids, anchors, positions, doc_ids)  # (B, Q)
                draft = draft.view(anchors.shape[0], anchors.shape[1], cfg.drafter.block_size)
                for name, values in evaluate.score_blocks(draft, batch["input_ids"], batch["lengths"], anchors.cpu(),
                                                          cfg.drafter.block_size).items():
                    scores[name] += values
        return {"step": self.step_count, "eval": True, **evaluate.summarise(scores)}

    def walk_prompts(self) -> list[list[int]]:
        """Held-out prompts: each sequence up to its first supervised token (the part the target continues)."""
        prompts = []
        for seq in self.eval_data.sequences[: self.cfg.walk_prompts]:
            first = next((i for i, m in enumerate(seq.loss_mask) if m), len(seq.input_ids))
            prompts.append(seq.input_ids[: max(1, first)])
        return prompts

    def evaluate_walk(self) -> dict:
        """Greedy speculative decoding with the drafter and the two no-learning rules, each checked lossless."""
        with self.monitor.excluding(), torch.no_grad():
            replica, block = self.replica, self.cfg.drafter.block_size
            replica.drafter.eval()
            proposers = {
                "drafter": walk.drafter_proposer(replica.drafter, replica.attention, replica.embed_weight,
                                                 replica.head_weight, self.mask_token_id, self.dtype),
                "repeat": walk.repeat_proposer(block), "copy": walk.copy_proposer(block)}
            result = walk.evaluate_walk(self.target, proposers, self.walk_prompts(), self.cfg.walk_new_tokens, block,
                                        self.layer_ids, self.dtype)
        return {"step": self.step_count, "eval": True, "method": "walk", **result}

    def _log_walk(self, row: dict) -> None:
        self._write(row)
        self.log(f"walk step {row['step']}: tau {row['walk_tau']:.2f} (repeat-anchor {row['walk_repeat_tau']:.2f}, "
                 f"copy {row['walk_copy_tau']:.2f}) over {row['walk_prompts']} prompts x {row['walk_new_tokens']} "
                 f"tokens, lossless ({row['walk_near_ties']} near-ties)")

    def _write(self, row: dict) -> None:
        if self._metrics is None:
            self._metrics = self.metrics_path.open("a")
            self._board = Board(self.out_dir)
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._board.write(row)

    def _log_eval(self, row: dict) -> None:
        self._write(row)
        self.log(f"eval step {row['step']}: tau {row['acceptance_length']:.2f} (repeat-anchor "
                 f"{row['baseline_repeat_tau']:.2f}, copy {row['baseline_copy_tau']:.2f}) over "
                 f"{row['eval_positions']} positions")

    def train(self) -> dict:
        cfg = self.cfg
        if cfg.compile:
            started = time.perf_counter()
            self.warmup()
            self.log(f"warm-up: {len(cfg.data.buckets)} buckets compiled in {time.perf_counter() - started:.1f}s "
                     f"({inductor_cache_counters()})")
        first_eval = self.evaluate()
        self._log_eval(first_eval)
        row = {}
        while self.step_count < cfg.steps:
            if self.interrupt.is_set():
                raise Interrupted
            row = self.step()
            self._write(row)
            if self.step_count % cfg.log_every == 0 or self.step_count == cfg.steps:
                self.log(f"step {row['step']:5d}  loss {row['loss']:.4f}  {row['tokens_per_s'] / 1000:.2f} Ktok/s  "
                         f"lr {row['lr']:.2e}  peak {row['peak_mem_bytes'] / 2**20:.0f} MiB  "
                         f"recompiles {row['recompiles']}  eager {row['eager_fallbacks']}")
            if cfg.eval_every and self.step_count % cfg.eval_every == 0 and self.step_count < cfg.steps:
                self._log_eval(self.evaluate())
            if cfg.ckpt_every and self.step_count % cfg.ckpt_every == 0:
                self.save_checkpoint()
        final_eval = self.evaluate()
        self._log_eval(final_eval)
        self.save_checkpoint()
        final_walk = self.evaluate_walk()
        self._log_walk(final_walk)
        return self.summary(first_eval, final_eval, final_walk, row)

    def summary(self, first_eval: dict, final_eval: dict, final_walk: dict, last_row: dict) -> dict:
        tau = final_eval["acceptance_length"]
        walk_tau = final_walk["walk_tau"]
        beats = walk_tau > max(final_walk["walk_repeat_tau"], final_walk["walk_copy_tau"])
        return {"summary": True, "walk_tau": walk_tau, "walk_repeat_tau": final_walk["walk_repeat_tau"],
                "walk_copy_tau": final_walk["walk_copy_tau"], "walk_method": final_walk["walk_method"],
                "walk_prompts": final_walk["walk_prompts"], "walk_near_ties": final_walk["walk_near_ties"],
                "tau_method": final_eval["tau_method"],
                "steps": self.step_count, "loss_start": self.first_loss,
                "loss_end": round(sum(self.recent_losses) / len(self.recent_losses), 5) if self.recent_losses else None, "tau_start": first_eval["acceptance_length"], "tau_end": tau,
                "baseline_repeat_tau": final_eval["baseline_repeat_tau"],
                "baseline_copy_tau": final_eval["baseline_copy_tau"], "beats_baselines": beats,
                "teacher_forced_beats_baselines": tau > max(final_eval["baseline_repeat_tau"],
                                                            final_eval["baseline_copy_tau"]),
                "tokens_per_s": last_row.get("tokens_per_s"), "useful_tokens_per_s": last_row.get("useful_tokens_per_s"),
                "pad_fraction": last_row.get("pad_fraction"), "recompiles": last_row.get("recompiles", 0),
                "eager_fallbacks": last_row.get("eager_fallbacks", 0), **inductor_cache_counters()}

    # -- state ------------------------------------------------------------------------------------
    @functools.cached_property
    def target_identity(self) -> dict | None:
        """What `trainer export` needs to rebuild a random target exactly as trained against; computed at the
        first checkpoint, not at start-up (warm-up and describe never need it)."""
        if self.cfg.target.path:
            return None
        return {"device_type": self.target_device.type, "dtype": str(self.dtype).removeprefix("torch."),
                "checksum": weights_checksum(self.target)}

    @property
    def replicas(self) -> list[Replica]:
        return [self.replica]

    def state_dict(self) -> dict:
        return {**self.replica.state_dict(), "step": self.step_count, "first_loss": self.first_loss,
                "config": self.cfg.to_dict(), "layer_ids": self.layer_ids, "mask_token_id": self.mask_token_id,
                "export": {"dtype": str(self.dtype).removeprefix("torch."), "target": self.target_identity,
                           "tokenizer": self.tokenizer_path,
                           "chat_template_kwargs": self.cfg.data.chat_template_kwargs},
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}

    def load_state_dict(self, state: dict) -> None:
        for replica in self.replicas:
            replica.load_state_dict(state)
        self.step_count, self.first_loss = state["step"], state.get("first_loss")
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])

    def save_checkpoint(self) -> Path:
        path = self.out_dir / CHECKPOINT
        checkpoint.save(path, self.state_dict())
        return path

    def close(self) -> None:
        """Safe to call twice."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
            self._board.close()
