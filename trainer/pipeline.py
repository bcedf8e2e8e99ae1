"""Target workers and drafter replicas as threads, each on its own device (DESIGN.md, Topology).

Target threads run the frozen target and push hidden-state batches into bounded per-replica
queues (backpressure keeps memory flat). Drafter threads, one per device, take their batch, run
the compiled loss under the compile gate, average gradients with the other replicas (and, under
torchrun, with other processes) every step, and apply identical updates, so every replica holds
bit-identical weights. Any exception stops every thread within seconds; every wait has a timeout.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch

from trainer import threadsafe
from trainer.loop import Interrupted, Trainer, _peak_memory, throughput, to_device, work_stats
from trainer.monitor import inductor_cache_counters
from trainer.target import build_target

POLL_S = 0.2  # how often blocked threads look at the stop flag
MAX_AHEAD = 4  # steps target workers may run ahead of the drafters (bounds queued and pending results)
BARRIER_TIMEOUT_S = 600.0  # a replica slower than this per step is stuck, not slow


class Stopped(Exception):
    """Another thread failed or the run was interrupted."""


class InjectedFailure(RuntimeError):
    """Raised on purpose by --fail-at, to test that a failing worker ends the whole run."""


@dataclass
class Job:
    step: int
    replica: int
    inputs: tuple  # tapped, block_ids, anchors, labels, weights, positions, doc_ids (on the target's device)
    tokens: int
    bucket: int
    stats: dict  # loop.work_stats


class ThreadedTrainer(Trainer):
    def __init__(self, cfg, out_dir, *, targets: list[str], drafters: list[str], mitigations: bool = True,
                 strict_compile: bool = False, fail_at: str | None = None, resume: bool = False, log=print,
                 dist=None, unwarmed: tuple[int, ...] = ()):
        self.mitigations, self.strict_compile, self.dist = mitigations, strict_compile, dist
        self.unwarmed = set(unwarmed)
        if mitigations:
            self.installed = threadsafe.install()  # before anything is compiled
        else:
            self.installed = {}
        self.gate = threadsafe.CompileGate(enabled=mitigations)
        if mitigations:
            threadsafe.apply_dynamo_settings(strict=strict_compile)
        super().__init__(cfg, out_dir, device=drafters[0], target_device=targets[0], resume=False, log=log)
        self.all_replicas = [self.replica] + [self.replica.clone_to(torch.device(d)) for d in drafters[1:]]
        self.targets = [self.target] + [build_target(cfg.target, device=d, dtype=self.dtype) for d in targets[1:]]
        self.fail_at = _parse_fail_at(fail_at)
        if resume:
            from trainer import checkpoint
            from trainer.loop import CHECKPOINT

            self.load_state_dict(checkpoint.load(self.out_dir / CHECKPOINT))
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.barrier = threading.Barrier(len(self.all_replicas))
        self.queues = [queue.Queue(maxsize=2) for _ in self.all_replicas]
        self._job_lock = threading.Lock()
        self._next_job = 0
        self._step_losses: dict[int, list[float]] = {}  # step -> each replica's loss
        self._step_tokens: dict[int, int] = {}
        self._step_stats: dict[int, dict] = {}
        self._start_step = 0
        self._grads: list[list[torch.Tensor] | None] = [None] * len(self.all_replicas)
        self._mean_grads: list[torch.Tensor] = []
        self.thread_tokens_per_s: dict[str, float] = {}
        self._training = False
        self._drafters_at = 0  # the step the drafter replicas work on
        self.max_pending = 0  # out-of-order results a drafter held at once (bounded by MAX_AHEAD)
        self._stop_after_step = False  # decided by replica 0 inside a step, read by all: they stop together

    @property
    def replicas(self):
        return getattr(self, "all_replicas", [self.replica])

    @property
    def world_size(self) -> int:
        return self.dist.get_world_size() if self.dist else 1

    # -- helpers ----------------------------------------------------------------------------------
    def _check(self, kind: str, index: int, step: int) -> None:
        if self.stop.is_set():
            raise Stopped
        if self.fail_at and self.fail_at[:3] == (kind, index, step):
            if self.fail_at[3] == "stall":  # a worker that hangs: the others must not wait forever
                self.stop.wait()
                raise Stopped
            if self.fail_at[3] == "slow":  # a worker far behind the others: memory must stay bounded
                time.sleep(2.0)
                return
            raise InjectedFailure(f"--fail-at {kind}:{index}:{step}")

    def _put(self, q: queue.Queue, item) -> None:
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                return q.put(item, timeout=POLL_S)
            except queue.Full:
                continue

    def _get(self, q: queue.Queue):
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                continue

    def _wait_for_room(self, step: int) -> None:
        """Target workers run at most MAX_AHEAD steps ahead of the drafters: out-of-order results stay bounded."""
        while step >= self._drafters_at + MAX_AHEAD:
            if self.stop.is_set():
                raise Stopped
            time.sleep(0.005)

    def _wait(self) -> None:
        try:
            self.barrier.wait(timeout=BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            if self.stop.is_set():
                raise Stopped from None
            # Nobody asked to stop: a replica stalled past the timeout or left. That is the run's error.
            raise RuntimeError(f"drafter replicas lost step sync (a replica stalled over {BARRIER_TIMEOUT_S:.0f}s "
                               f"or exited); the run stops here") from None

    def _thread(self, name: str, body, *args) -> threading.Thread:
        def run():
            try:
                if self.mitigations:
                    threadsafe.apply_dynamo_settings(strict=self.strict_compile)
                body(*args)
            except Stopped:
                pass
            except BaseException as exc:  # the first error ends the run; its traceback is kept
                self.errors.append(exc)
                self.stop.set()
                self.barrier.abort()

        return threading.Thread(target=run, name=name, daemon=True)

    # -- the workers ------------------------------------------------------------------------------
    def _target_worker(self, index: int) -> None:
        target_model = self.targets[index]
        replicas = len(self.all_replicas)
        rank = self.dist.get_rank() if self.dist else 0
        while True:
            with self._job_lock:
                job, self._next_job = self._next_job, self._next_job + 1
            step, replica = divmod(job, replicas)
            step += self._start_step
            if step >= self.cfg.steps:
                return
            self._wait_for_room(step)
            self._check("target", index, step)
            global_index = (step * self.world_size + rank) * replicas + replica
            batch = self.train_data.batch(global_index, self.cfg.batch_size, self.cfg.seed)
            generator = torch.Generator().manual_seed(self.cfg.seed * 7_919 + global_index)
            with self.gate.shared():  # a foreign trace must not capture the target's module calls (H2)
                inputs = self._prepare(batch, generator, target_model)
            self._put(self.queues[replica], Job(step, replica, inputs, int(batch["lengths"].sum()),
                                                int(batch["input_ids"].shape[1]), work_stats(batch, inputs[2])))

    def _drafter_worker(self, index: int) -> None:
        replica = self.all_replicas[index]
        pending: dict[int, Job] = {}
        started = time.perf_counter()
        tokens = 0
        for step in range(self._start_step, self.cfg.steps):
            while step not in pending:
                job = self._get(self.queues[index])
                pending[job.step] = job
                self.max_pending = max(self.max_pending, len(pending))
            job = pending.pop(step)
            self._check("drafter", index, step)
            replica.drafter.train()
            with self.gate.for_shape((index, job.bucket)):
                loss = replica.loss_fn(*to_device(job.inputs, replica.device))
                loss.backward()
            self._average_gradients(index, replica)
            replica.apply_gradients()
            tokens += job.tokens
            self._record(index, step, float(loss.detach()), job)  # host sync once per step
            self.thread_tokens_per_s[f"drafter{index}"] = round(tokens / (time.perf_counter() - started), 1)
            if index == 0:
                self._drafters_at = step + 1  # replicas move in lockstep: one of them speaks for all
            if self._stop_after_step:
                return

    def _average_gradients(self, index: int, replica) -> None:
        params = [p for p in replica.drafter.parameters() if p.requires_grad]
        self._grads[index] = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self._wait()
        if index == 0:
            self._stop_after_step = self.interrupt.is_set()  # every replica reads it after the next wait
            self._mean_grads = _mean_across(self._grads, replica.device)
            if self.dist:
                self._mean_grads = all_reduce_mean(self.dist, self._mean_grads, self.world_size)
        self._wait()
        for param, mean in zip(params, self._mean_grads):
            param.grad = mean.to(param.device, non_blocking=True) if param.device != mean.device else mean.clone()
        self._wait()  # every replica has its copy before the next step overwrites the mean

    def _record(self, index: int, step: int, loss: float, job: Job) -> None:
        with self._job_lock:
            losses = self._step_losses.setdefault(step, [])
            losses.append(loss)
            complete = len(losses) == len(self.all_replicas)
            self._step_tokens[step] = self._step_tokens.get(step, 0) + job.tokens
            stats = self._step_stats.setdefault(step, {})
            for key, value in job.stats.items():
                stats[key] = stats.get(key, 0) + value
            if complete:
                self._completed.put((step, sum(losses) / len(losses), self._step_tokens.pop(step), job.bucket,
                                     self._step_stats.pop(step)))
                self._step_losses.pop(step)

    # -- the run ----------------------------------------------------------------------------------
    def warmup(self, progress=None, buckets: list[int] | None = None) -> list[int]:
        """Single-threaded compile of every bucket on every replica, before any worker starts (H4)."""
        if buckets is None:  # --unwarmed leaves some out, to show what a shape nobody warmed does
            buckets = [b for b in self.cfg.data.buckets if b not in self.unwarmed]
        buckets = super().warmup(progress, buckets)
        self.gate.warmed = {(index, bucket) for index in range(len(self.all_replicas)) for bucket in buckets}
        return buckets

    def train(self) -> dict:
        cfg = self.cfg
        started = time.perf_counter()
        self.warmup()
        self.log(f"warm-up: {len(cfg.data.buckets)} buckets x {len(self.all_replicas)} replicas in "
                 f"{time.perf_counter() - started:.1f}s ({inductor_cache_counters()}); mitigations: "
                 f"{self.installed or 'OFF'}")
        first_eval = self.evaluate() if self._is_writer() else {}
        if first_eval:
            self._log_eval(first_eval)
        self._completed: queue.Queue = queue.Queue()
        self._start_step = self._drafters_at = self.step_count
        # Every key exists before the threads start: the main thread copies this dict while they update it.
        self.thread_tokens_per_s = {f"drafter{i}": 0.0 for i in range(len(self.all_replicas))}
        threads = [self._thread(f"target{i}", self._target_worker, i) for i in range(len(self.targets))]
        threads += [self._thread(f"drafter{i}", self._drafter_worker, i) for i in range(len(self.all_replicas))]
        drafters = threads[len(self.targets):]
        for thread in threads:
            thread.start()
        self._training = True
        row = {}
        step_started = time.perf_counter()
        try:
            while self.step_count < cfg.steps:
                if self.errors or (self.interrupt.is_set() and not any(t.is_alive() for t in drafters)):
                    break
                try:
                    step, loss, tokens, bucket, stats = self._completed.get(timeout=POLL_S)
                except queue.Empty:
                    if not any(t.is_alive() for t in drafters):  # nothing more can complete
                        break
                    continue
                now = time.perf_counter()
                self.step_count = step + 1
                row = self._row(loss, tokens * self.world_size, now - step_started, bucket, stats)
                step_started = now
                if self.first_loss is None:
                    self.first_loss = loss
                self.recent_losses = (self.recent_losses + [loss])[-cfg.log_every:]
                self._after_step(row)
        except BaseException:
            self.stop.set()
            self.barrier.abort()
            raise
        finally:
            if self.errors:
                self.stop.set()
            for thread in drafters:  # they end after the last step, the interrupted one, or on an error
                thread.join()
            self.stop.set()  # target workers may wait on full queues nobody will empty
            for thread in threads:
                thread.join()
            self._training = False
        if self.errors:
            raise self.errors[0]
        while not self._completed.empty():  # steps every replica finished after the loop stopped reading
            step, loss, tokens, bucket, stats = self._completed.get()
            self.step_count = step + 1
            row = self._row(loss, tokens * self.world_size, time.perf_counter() - step_started, bucket, stats)
            self._after_step(row)
        rank = self.dist.get_rank() if self.dist else 0
        self.log(f"rank {rank}: drafter weights sha256 {weights_digest(self.replica.drafter)[:16]}, replicas "
                 f"identical: {len({weights_digest(r.drafter) for r in self.all_replicas}) == 1}")
        if self.interrupt.is_set() and self.step_count < cfg.steps:
            raise Interrupted
        if self.step_count < cfg.steps:
            raise RuntimeError(f"the drafter threads ended at step {self.step_count} of {cfg.steps} without an error; "
                               f"this is a bug")
        final_eval = self.evaluate() if self._is_writer() else {}
        if final_eval:
            self._log_eval(final_eval)
            self.save_checkpoint()
            final_walk = self.evaluate_walk()
            self._log_walk(final_walk)
            return self.summary(first_eval, final_eval, final_walk, row)
        return {}

    def _row(self, loss: float, tokens: int, seconds: float, bucket: int, stats: dict) -> dict:
        health = self.monitor.since_warm()
        # Compiles after warm-up that went through the gate count too (a shape outside the buckets).
        health["recompiles"] = max(health["recompiles"], self.gate.exclusive_entries)
        positions = len(self.all_replicas) * self.cfg.batch_size * bucket * self.world_size  # padding included
        return {"step": self.step_count, "loss": round(loss, 5), **throughput(positions, tokens, seconds), **stats,
                "lr": self.replica.scheduler.get_last_lr()[0],
                "peak_mem_bytes": {str(r.device): _peak_memory(r.device) for r in self.all_replicas},
                "bucket": bucket, "world_size": self.world_size, "threads_tokens_per_s": dict(self.thread_tokens_per_s),
                **health}

    def _after_step(self, row: dict) -> None:
        cfg = self.cfg
        if self.strict_compile and (row["recompiles"] or row["eager_fallbacks"]):
            raise RuntimeError(f"--strict-compile: {row['recompiles']} recompiles and {row['eager_fallbacks']} eager "
                               f"fallbacks after warm-up (HAZARDS.md H4/H8: a new shape or a silent eager path)")
        if not self._is_writer():
            return
        self._write(row)
        if self.step_count % cfg.log_every == 0 or self.step_count == cfg.steps:
            self.log(f"step {row['step']:5d}  loss {row['loss']:.4f}  {row['tokens_per_s'] / 1000:.2f} Ktok/s  "
                     f"threads {row['threads_tokens_per_s']}  recompiles {row['recompiles']}  "
                     f"eager {row['eager_fallbacks']}")
        if cfg.ckpt_every and self.step_count % cfg.ckpt_every == 0:
            self.save_checkpoint()

    def busy(self) -> bool:
        return self._training

    def _is_writer(self) -> bool:
        return not self.dist or self.dist.get_rank() == 0

    def save_checkpoint(self):
        if self._is_writer():
            return super().save_checkpoint()
        return None


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 over a module's parameters, bit for bit (replicas must agree exactly)."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(module.state_dict().items()):
        digest.update(name.encode() + param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _mean_across(grads: list[list[torch.Tensor]], device: torch.device) -> list[torch.Tensor]:
    """Element-wise mean of each parameter's gradient over replicas, on `device`."""
    count = len(grads)
    if device.type == "cuda" and all(g[0].is_cuda for g in grads):
        from torch.cuda import comm

        return [comm.reduce_add([g[i] for g in grads], destination=device.index).div_(count)
                for i in range(len(grads[0]))]
    return [torch.stack([g[i].to(device) for g in grads]).sum(0).div_(count) for i in range(len(grads[0]))]


def all_reduce_mean(dist, grads: list[torch.Tensor], world_size: int) -> list[torch.Tensor]:
    """One all-reduce over one flat buffer per dtype (not one call per parameter), then views back."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    out: list[torch.Tensor | None] = [None] * len(grads)
    for dtype in {g.dtype for g in grads}:
        indices = [i for i, g in enumerate(grads) if g.dtype == dtype]
        flat = _flatten_dense_tensors([grads[i] for i in indices])
        dist.all_reduce(flat)
        flat.div_(world_size)
        for i, view in zip(indices, _unflatten_dense_tensors(flat, [grads[i] for i in indices])):
            out[i] = view
    return out


def _parse_fail_at(spec: str | None):
    if not spec:
        return None
    kind, index, step, *how = spec.split(":")  # KIND:INDEX:STEP[:stall|slow]
    return kind, int(index), int(step), (how or ["raise"])[0]
