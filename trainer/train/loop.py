"""The training loop: warm-up, evaluation, the steps an executor runs, metrics, checkpoints, the summary.

One loop for every layout: `Trainer.sequential` (one device, the calling thread) and
`Trainer.threaded` (target and drafter threads across devices, torchrun) differ only in the
executor they hand it (trainer/train/executors.py). Signals only set `interrupt`; the loop stops at the
next step boundary, so a checkpoint never holds step s+1's weights labelled step s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import resource
import threading
import time
from pathlib import Path

import torch

from trainer.common.errors import NonFiniteLoss, TrainerInputError
from trainer.common.records import EvalRow, StepRow, Summary, WalkRow
from trainer.config.schema import TrainConfig
from trainer.eval.evaluator import Evaluator, describe_eval, describe_walk
from trainer.metrics.board import Board
from trainer.metrics.monitor import CompileMonitor, inductor_cache_counters
from trainer.model.target import weights_checksum
from trainer.safety import threadsafe
from trainer.train import checkpoint
from trainer.train.executors import SequentialExecutor, StepResult, ThreadedExecutor
from trainer.train.faults import NONE as NO_FAULTS, Faults
from trainer.train.gradients import any_rank, max_across_ranks, sum_across_ranks, weights_digest
from trainer.train.launcher import restart_count
from trainer.train.setup import Setup, build, device_of

CHECKPOINT = "checkpoint.pt"


class Interrupted(Exception):
    """SIGINT or SIGTERM took effect at a step boundary: the state is that of the steps completed."""


def throughput(positions: int, useful: int, seconds: float) -> dict:
    """tokens_per_s counts every position processed, padding included; useful_tokens_per_s only real tokens."""
    return {"tokens_per_s": round(positions / seconds, 1), "useful_tokens_per_s": round(useful / seconds, 1),
            "pad_fraction": round(1 - useful / positions, 4) if positions else 0.0}


def peak_rss() -> int:
    """This process's peak resident memory on the host, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_memory(device: torch.device) -> int:
    """Peak since the last call on CUDA (a per-step peak shows whether memory is flat); process peak RSS on CPU."""
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class Trainer:
    def __init__(self, setup: Setup, executor, out_dir: str | Path, *, resume: bool = False, log=print,
                 dist=None, strict_compile: bool = False, installed_mitigations: dict | None = None):
        self.setup, self.executor, self.cfg, self.log = setup, executor, setup.cfg, log
        # What threadsafe.install() put in place (None: a layout without threads; {}: switched off).
        self.dist, self.strict_compile, self.installed_mitigations = dist, strict_compile, installed_mitigations
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.monitor = CompileMonitor()
        self.evaluator = Evaluator(setup, self.monitor, log)
        self.walk_file_prompts = self.evaluator.read_walk_files()
        self.step_count = 0
        self.first_loss: float | None = None
        self.recent_losses: list[float] = []  # the summary's end loss is their mean: one batch is noisy
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self._metrics = None
        self._last_row: dict = {}  # the last step's row, for the summary
        self.interrupt = threading.Event()
        # Every rank makes it, in the same order (collective); the stop flag travels through it.
        self._flag_group = dist.new_group(backend="gloo") if dist else None
        self._looping = False
        self._started = False
        self._clock: float | None = None  # when the last step ended (None: no step since a pause)
        # torchrun counts restarts per agent, and an agent restarted only because another node's group
        # re-joined the rendezvous counts none (pytorch/pytorch#135712): the group's figure is the largest,
        # and every rank takes the same decision to resume.
        self.restarts = max_across_ranks(dist, restart_count(), self._flag_group) if dist else restart_count()
        # A step trains one batch per (rank, replica): the epoch order is cut into steps of that many batches.
        self.slots = len(setup.replicas) * (dist.get_world_size() if dist else 1)
        self.steps_per_epoch = setup.train_data.steps_per_epoch(self.slots, self.cfg.batch_size)
        if self.cfg.epochs:
            self.cfg.steps = self.cfg.epochs * self.steps_per_epoch
            self.log(f"data: {self.cfg.epochs} epochs of {self.steps_per_epoch} steps ({self.slots} batches of "
                     f"{self.cfg.batch_size} rows a step): {self.cfg.steps} steps")
        self.peak_rss_by_rank: dict[str, int] = {}  # set at the end of train(), every rank's
        self.rows_seen = 0  # training rows (not padding rows) trained so far, summed over ranks and replicas
        self.positions_done = self.useful_done = 0  # this process's steps: the summary's padding, not one step's
        state = self._resume_state(resume or self.restarts > 0)
        if state is not None and resume and not self.restarts and state["step"] >= self.cfg.steps:
            raise TrainerInputError(f"checkpoint {self.out_dir / CHECKPOINT} is at step {state['step']}, the run's "
                                    f"last ({self.cfg.steps}): nothing to resume; raise --steps to train on, or "
                                    f"evaluate it with `python -m trainer eval --ckpt {self.out_dir / CHECKPOINT}`")
        if state is not None:
            self.load_state_dict(state)
            again = f" (restart {self.restarts} of the worker group: steps after it are done again)" if self.restarts else ""
            self.log(f"resumed from rank 0's {CHECKPOINT} at step {self.step_count}{again}")

    @classmethod
    def sequential(cls, cfg: TrainConfig, out_dir: str | Path, *, device: str | None = None, resume: bool = False,
                   log=print, strict_compile: bool = False) -> "Trainer":
        """One target and one drafter replica on one device, stepped in the calling thread."""
        threadsafe.apply_dynamo_settings(strict=strict_compile)  # the recompile limit and a loud nested trace
        setup = build(cfg, drafters=[device], targets=[device], log=log)
        return cls(setup, SequentialExecutor(setup), out_dir, resume=resume, log=log, strict_compile=strict_compile)

    @classmethod
    def threaded(cls, cfg: TrainConfig, out_dir: str | Path, *, targets: list[str], drafters: list[str],
                 mitigations: bool = True, strict_compile: bool = False, resume: bool = False, log=print, dist=None,
                 faults: Faults = NO_FAULTS) -> "Trainer":
        """Target workers and drafter replicas as threads, each on its device; under torchrun one process each."""
        installed = threadsafe.install() if mitigations else {}  # before any replica compiles its loss
        if mitigations:
            threadsafe.apply_dynamo_settings(strict=strict_compile)
        setup = build(cfg, drafters=drafters, targets=targets, log=log)
        executor = ThreadedExecutor(setup, gate=threadsafe.CompileGate(enabled=mitigations), mitigations=mitigations,
                                    strict_compile=strict_compile, dist=dist, faults=faults)
        return cls(setup, executor, out_dir, resume=resume, log=log, dist=dist, strict_compile=strict_compile,
                   installed_mitigations=installed)

    def _resume_state(self, wanted: bool) -> dict | None:
        """The checkpoint to continue from: `--resume`, or a torchrun restart. Under torchrun only rank 0's
        checkpoint counts, handed to every rank (nodes need no shared filesystem)."""
        if not wanted:
            return None
        path = self.out_dir / CHECKPOINT
        if not self.dist:
            return checkpoint.load(path)
        # A restart before the first checkpoint starts over; an explicit --resume needs one.
        state = checkpoint.load(path) if self.is_writer() and (path.exists() or self.restarts == 0) else None
        # Sent as a uint8 tensor of checkpoint bytes and read back weights-only, never as a pickle: the c10d
        # rendezvous is unauthenticated, so whoever ranks first is "rank 0" and must not run code here.
        data = checkpoint.to_bytes(state) if state is not None else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self.dist.broadcast(size, src=0, group=self._flag_group)
        if int(size) == 0:
            return None
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
            torch.empty(int(size), dtype=torch.uint8)
        self.dist.broadcast(payload, src=0, group=self._flag_group)
        return state if data else checkpoint.from_bytes(payload.numpy().tobytes(), "rank 0")

    # -- warm-up and steps ------------------------------------------------------------------------
    def warmup(self, progress=None, buckets: list[int] | None = None) -> list[int]:
        """Compile every length bucket (or those given), forward and backward, single-threaded."""
        buckets = self.executor.warmup(self.cfg.data.buckets if buckets is None else buckets, progress)
        self.monitor.mark_warm()
        return buckets

    def request_stop(self) -> bool:
        """From a signal handler: stop at the next step boundary. False when no step loop runs (stop now)."""
        self.interrupt.set()
        return self._looping

    def step(self) -> StepRow:
        """The executor's next step, as a metrics row."""
        if not self._started:
            self.executor.start(self.step_count)
            self._started = True
        # From the end of the previous step: the loop's own work between steps is part of a step's cost
        # (the threaded executor's target workers run on meanwhile, so next() alone would read fast).
        started = self._clock if self._clock is not None else time.perf_counter()
        result = self.executor.next()
        if self.dist:  # the group's figures: every process's tokens, not rank 0's times the world size
            counts = sum_across_ranks(self.dist, {"useful": result.useful_tokens, "positions": result.positions,
                                                  **{f"stat:{k}": v for k, v in result.stats.items()}},
                                      self._flag_group)
            result = dataclasses.replace(result, useful_tokens=int(counts["useful"]), positions=int(counts["positions"]),
                                         stats={k: type(result.stats[k])(counts[f"stat:{k}"]) for k in result.stats})
        self._clock = time.perf_counter()
        seconds = self._clock - started
        self.step_count = result.step
        if not math.isfinite(result.loss):
            raise NonFiniteLoss(f"the loss is {result.loss} at step {result.step}; the run stops as failed (lower lr, "
                                f"check drafter.gamma and the data); the last checkpoint is from before it")
        if self.first_loss is None:
            self.first_loss = result.loss
        self.recent_losses = (self.recent_losses + [result.loss])[-self.cfg.log_every:]
        return self._row(result, seconds)

    def _row(self, result: StepResult, seconds: float) -> StepRow:
        extra = dict(result.extra)
        health = self.monitor.since_warm()
        # Compiles after warm-up that went through the compile gate count too (a shape outside the buckets).
        health["recompiles"] = max(health["recompiles"], extra.pop("gated_compiles", 0))
        devices = [replica.device for replica in self.setup.replicas]
        peak = peak_memory(devices[0]) if len(devices) == 1 else {str(d): peak_memory(d) for d in devices}
        self.rows_seen += result.stats.get("rows", 0)
        self.positions_done += result.positions
        self.useful_done += result.useful_tokens
        return StepRow(step=result.step, loss=round(result.loss, 5), epoch=(result.step - 1) // self.steps_per_epoch,
                       rows_seen=self.rows_seen, peak_rss_bytes=peak_rss(),
                       **throughput(result.positions, result.useful_tokens, seconds), **result.stats,
                       lr=self.setup.replica.scheduler.get_last_lr()[0], peak_mem_bytes=peak, bucket=result.bucket,
                       **extra, **health)

    def _after_step(self, row: dict) -> None:
        cfg = self.cfg
        if self.strict_compile and (row["recompiles"] or row["eager_fallbacks"]):
            raise RuntimeError(f"--strict-compile: {row['recompiles']} recompiles and {row['eager_fallbacks']} eager "
                               f"fallbacks after warm-up (HAZARDS.md H4/H8: a new shape or a silent eager path)")
        if not self.is_writer():
            return
        self._write(row)
        if self.step_count % cfg.log_every == 0 or self.step_count == cfg.steps:
            peak = row["peak_mem_bytes"]
            peak = peak if isinstance(peak, int) else max(peak.values())
            threads = f"  threads {row['threads_tokens_per_s']}" if "threads_tokens_per_s" in row else ""
            self.log(f"step {row['step']:5d}  loss {row['loss']:.4f}  {row['tokens_per_s'] / 1000:.2f} Ktok/s  "
                     f"lr {row['lr']:.2e}  peak {peak / 2**20:.0f} MiB{threads}  "
                     f"recompiles {row['recompiles']}  eager {row['eager_fallbacks']}")
        if cfg.eval_every and self.step_count % cfg.eval_every == 0 and self.step_count < cfg.steps:
            with self.executor.paused():
                self._log_eval(self.evaluate())
            self._clock = None  # an evaluation is no step's cost
        if cfg.ckpt_every and self.step_count % cfg.ckpt_every == 0:
            self.save_checkpoint()
            self._clock = None

    # -- the run ----------------------------------------------------------------------------------
    def describe_run(self) -> str:
        """One line on how this run runs, logged before anything else of the run."""
        cfg, setup = self.cfg, self.setup
        world = self.dist.get_world_size() if self.dist else 1
        layout = "processes (torchrun)" if self.dist else ("threads" if self.installed_mitigations is not None
                                                           else "sequential")
        devices = sorted({str(device_of(model)) for model in setup.targets} | {str(r.device) for r in setup.replicas})
        mitigations = ("n/a" if self.installed_mitigations is None
                       else ", ".join(self.installed_mitigations) or "OFF")
        compiled = "off" if not cfg.compile else ("on, strict" if self.strict_compile else "on")
        target_compiled = any("_envkit_eager_forward" in layer.__dict__ for layer in setup.target.model.layers)
        return (f"run: layout {layout}, world size {world}, {len(setup.targets)} target(s) and "
                f"{len(setup.replicas)} drafter replica(s) on {', '.join(devices)}; attention {setup.backend}, "
                f"compile {compiled}, compiled target {'on' if target_compiled else 'off'}, fp8 {cfg.fp8}; "
                f"mitigations {mitigations}; data {cfg.data.path or cfg.data.source}; compile cache "
                f"{os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'torch default (not private)')}")

    def train(self) -> Summary | dict:
        cfg = self.cfg
        if self.is_writer():
            self.log(self.describe_run())
        started = time.perf_counter()
        buckets = self.warmup()
        mitigations = "" if self.installed_mitigations is None else \
            f"; mitigations: {self.installed_mitigations or 'OFF'}"
        rank = f"rank {self.dist.get_rank()}: " if self.dist else ""  # every rank says what it hit and missed
        self.log(f"{rank}warm-up: {len(buckets)} buckets x {len(self.setup.replicas)} replicas in "
                 f"{time.perf_counter() - started:.1f}s ({inductor_cache_counters()}){mitigations}")
        first_eval = self.evaluate() if self.is_writer() else {}
        if first_eval:
            self._log_eval(first_eval)
        self._looping = True
        try:
            while self.step_count < cfg.steps and not self._stop_requested():
                self._after_step(self.step())
        finally:
            self._looping = False
            self.executor.close()
        if len(self.setup.replicas) > 1 or self.dist:
            self._log_replica_digests()
        if self.step_count < cfg.steps:
            raise Interrupted
        counters = inductor_cache_counters()
        rss = {"rank0": peak_rss()}
        if self.dist:  # collective: every rank takes part, the summary carries the group's sums
            counters = {k: int(v) for k, v in sum_across_ranks(self.dist, counters, self._flag_group).items()}
            rank, world = self.dist.get_rank(), self.dist.get_world_size()
            mine = {f"rank{r}": peak_rss() if r == rank else 0 for r in range(world)}  # each rank fills its own
            rss = {k: int(v) for k, v in sum_across_ranks(self.dist, mine, self._flag_group).items()}
        self.peak_rss_by_rank = rss
        if not self.is_writer():  # a torchrun rank other than 0: rank 0 evaluates, checkpoints and reports
            return {}
        final_eval = self.evaluate()
        self._log_eval(final_eval)
        self.save_checkpoint()
        final_walk = self.evaluate_walk()
        self._log_walk(final_walk)
        self.evaluator.log_walk_example(final_walk["walk_tau_by_prompt"])
        by_file = self.evaluator.walk_files(self.step_count, self.walk_file_prompts)
        for name, row in by_file.items():
            self.log(f"walk on {name}: tau {row['walk_tau']:.2f} (repeat-anchor {row['walk_repeat_tau']:.2f}, copy "
                     f"{row['walk_copy_tau']:.2f}) over {row['walk_counted']} prompts")
        return self.summary(first_eval, final_eval, final_walk, counters) | {"walk_by_file": by_file}

    def _stop_requested(self) -> bool:
        """A signal here, or under torchrun in any process: every rank stops after the same step. The
        executor is idle between steps, so this all-reduce never interleaves with the gradients'."""
        if self.dist:
            return any_rank(self.dist, self.interrupt.is_set(), self._flag_group)
        return self.interrupt.is_set()

    def _log_replica_digests(self) -> None:
        digests = {weights_digest(r.drafter) for r in self.setup.replicas}
        rank = self.dist.get_rank() if self.dist else 0
        self.log(f"rank {rank}: drafter weights sha256 {weights_digest(self.setup.replica.drafter)[:16]}, "
                 f"replicas identical: {len(digests) == 1}")

    def is_writer(self) -> bool:
        return not self.dist or self.dist.get_rank() == 0

    # -- evaluation (trainer/eval/evaluator.py) ----------------------------------------------------
    def evaluate(self) -> EvalRow:
        return self.evaluator.teacher_forced(self.step_count)

    def evaluate_walk(self, taps: list[int] | None = None, zero_context: bool = False,
                      prompts: list[list[int]] | None = None) -> WalkRow:
        return self.evaluator.walk(self.step_count, taps, zero_context, prompts)

    def summary(self, first_eval: dict, final_eval: dict, final_walk: dict, counters: dict) -> Summary:
        tau = final_eval["acceptance_length"]
        walk_tau = final_walk["walk_tau"]
        last_row = self._last_row
        # The fields: trainer/common/records.py Summary.
        return {"summary": True, "walk_tau": walk_tau, "walk_repeat_tau": final_walk["walk_repeat_tau"],
                "walk_copy_tau": final_walk["walk_copy_tau"], "walk_method": final_walk["walk_method"],
                "walk_prompts": final_walk["walk_prompts"], "walk_new_tokens": final_walk["walk_new_tokens"],
                "walk_near_ties": final_walk["walk_near_ties"], "walk_degenerate": final_walk["walk_degenerate"],
                "walk_counted": final_walk["walk_counted"],
                "tau_method": final_eval["tau_method"],
                "steps": self.step_count, "loss_start": self.first_loss,
                "loss_end": round(sum(self.recent_losses) / len(self.recent_losses), 5) if self.recent_losses else None,
                "tau_start": first_eval["acceptance_length"], "tau_end": tau,
                "baseline_repeat_tau": final_eval["baseline_repeat_tau"],
                "baseline_copy_tau": final_eval["baseline_copy_tau"],
                "beats_baselines": walk_tau > max(final_walk["walk_repeat_tau"], final_walk["walk_copy_tau"]),
                "teacher_forced_beats_baselines": tau > max(final_eval["baseline_repeat_tau"],
                                                            final_eval["baseline_copy_tau"]),
                "tokens_per_s": last_row.get("tokens_per_s"), "useful_tokens_per_s": last_row.get("useful_tokens_per_s"),
                "pad_fraction": round(1 - self.useful_done / self.positions_done, 4) if self.positions_done
                else None,
                "recompiles": last_row.get("recompiles", 0),
                "eager_fallbacks": last_row.get("eager_fallbacks", 0), "graph_breaks": last_row.get("graph_breaks", 0),
                "world_size": self.dist.get_world_size() if self.dist else 1, "restarts": self.restarts,
                "epochs": self.step_count / self.steps_per_epoch, "rows_seen": self.rows_seen,
                "peak_rss_bytes_by_rank": self.peak_rss_by_rank or {"rank0": peak_rss()}, **counters}

    # -- metrics ----------------------------------------------------------------------------------
    def _write(self, row: dict) -> None:
        if self._metrics is None:
            self._metrics = self.metrics_path.open("a")
            self._board = Board(self.out_dir)
        if "loss" in row:
            self._last_row = row
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._board.write(row)

    def _log_eval(self, row: dict) -> None:
        self._write(row)
        self.log(describe_eval(row))

    def _log_walk(self, row: dict) -> None:
        self._write(row)
        for line in describe_walk(row):
            self.log(line)

    # -- state ------------------------------------------------------------------------------------
    @functools.cached_property
    def target_identity(self) -> dict | None:
        """What `trainer export` needs to rebuild a random target exactly as trained against; computed at the
        first checkpoint, not at start-up (warm-up and describe never need it)."""
        if self.cfg.target.path:
            return None
        return {"device_type": self.setup.target_device.type, "dtype": str(self.setup.dtype).removeprefix("torch."),
                "checksum": weights_checksum(self.setup.target)}

    def state_dict(self) -> dict:
        setup = self.setup
        return {**setup.replica.state_dict(), "step": self.step_count, "first_loss": self.first_loss,
                "rows_seen": self.rows_seen,
                "config": self.cfg.to_dict(), "layer_ids": setup.layer_ids, "mask_token_id": setup.mask_token_id,
                "export": {"dtype": str(setup.dtype).removeprefix("torch."), "target": self.target_identity,
                           "tokenizer": setup.tokenizer_path,
                           "chat_template_kwargs": self.cfg.data.chat_template_kwargs},
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}

    def load_state_dict(self, state: dict) -> None:
        path = self.out_dir / CHECKPOINT
        checkpoint.check_compatible(path, state, self.cfg.to_dict())
        try:
            for replica in self.setup.replicas:
                replica.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as exc:  # a weight of another shape, a missing optimizer state
            raise TrainerInputError(f"checkpoint {path} does not fit this run's drafter "
                                    f"({str(exc).strip().splitlines()[0][:160]}); start a new run") from None
        checkpoint.restore_rng(path, state.get("rng"))
        self.step_count, self.first_loss = state["step"], state.get("first_loss")
        rows_seen = state.get("rows_seen", 0)
        self.rows_seen = rows_seen if isinstance(rows_seen, int) and not isinstance(rows_seen, bool) else 0

    def save_checkpoint(self) -> Path | None:
        if not self.is_writer():
            return None
        path = self.out_dir / CHECKPOINT
        checkpoint.save(path, self.state_dict())
        return path

    def close(self) -> None:
        """Safe to call twice."""
        self.executor.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
            self._board.close()
