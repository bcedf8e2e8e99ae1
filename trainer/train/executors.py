"""How steps run: in the calling thread, or as target and drafter threads across devices (DESIGN.md, Topology).

Both executors have one interface, which the loop (trainer/train/loop.py) drives:

    warmup(buckets, progress) -> buckets   compile every bucket, single-threaded (HAZARDS.md H4)
    start(step)                            begin at `step` (0, or a checkpoint's)
    next() -> StepResult                   run the next step to its end: every replica has applied it
    paused()                               a context in which nothing else touches the models
    close()                                stop and join every thread (safe twice)

Between two next() calls no replica computes, so the loop evaluates, checkpoints and stops at step
boundaries without asking the threads. Target threads run ahead (at most MAX_AHEAD steps) and push
prepared work into bounded per-replica queues; drafter threads, one per device, run the compiled
loss under the compile gate, average gradients (and under torchrun all-reduce them) and apply the
same update, so replicas stay bit-identical. The first error in any thread ends the run; a worker
that stops making progress is an error after STALL_TIMEOUT_S, never a hang.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from trainer.train import features

from trainer.safety import threadsafe
from trainer.train.faults import NONE as NO_FAULTS, Faults
from trainer.train.gradients import all_reduce_mean, mean_across
from trainer.train.setup import Setup
from trainer.train.steps import Work, batch_slot, compile_buckets, forward_backward, work_for

POLL_S = 0.2  # how often blocked threads look at the stop flag
MAX_AHEAD = 4  # steps target workers may run ahead of the drafters (bounds queued and pending work)
STALL_TIMEOUT_S = 600.0  # a step that makes no progress for this long is stuck, not slow


@dataclass
class StepResult:
    step: int  # steps done, this one included
    loss: float  # mean over replicas
    useful_tokens: int  # over this process's replicas (the loop sums over processes)
    positions: int  # padding included
    bucket: int
    stats: dict  # work_stats, summed over replicas
    extra: dict = field(default_factory=dict)  # the executor's own figures, for the metrics row


class SequentialExecutor:
    """One target and one replica, one step at a time in the calling thread."""

    def __init__(self, setup: Setup):
        self.setup = setup
        self.step = 0
        self.features = None  # the rows' target states, when computing them once pays (trainer/train/features.py)

    def warmup(self, buckets: list[int], progress=None) -> list[int]:
        compile_buckets(self.setup, buckets, progress)
        return buckets

    def start(self, step: int) -> None:
        self.step = step
        if features.worth_computing(self.setup):
            self.features = features.compute(self.setup)

    def next(self) -> StepResult:
        replica = self.setup.replica
        work = work_for(self.setup, self.step, 0, 1, features=self.features)
        loss = forward_backward(replica, work.inputs)
        replica.apply_gradients()
        self.step += 1
        return StepResult(self.step, float(loss.detach()), work.useful_tokens, work.positions, work.bucket,
                          work.stats)

    def paused(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


class Stopped(Exception):
    """Another thread failed or the run is closing."""


class ThreadedExecutor:
    """Target workers and drafter replicas as threads, each on its device."""

    def __init__(self, setup: Setup, *, gate: threadsafe.CompileGate, mitigations: bool = True,
                 strict_compile: bool = False, dist=None, faults: Faults = NO_FAULTS):
        self.setup, self.gate, self.dist = setup, gate, dist
        self.mitigations, self.strict_compile = mitigations, strict_compile
        self.faults = faults
        self.world_size = dist.get_world_size() if dist else 1
        self.rank = dist.get_rank() if dist else 0
        replicas = len(setup.replicas)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.barrier = threading.Barrier(replicas)
        self.work_queues = [queue.Queue(maxsize=2) for _ in range(replicas)]
        self.go = [queue.Queue() for _ in range(replicas)]  # the loop's go-ahead, one step at a time
        self.done: queue.Queue = queue.Queue()  # (replica, loss, work) as each replica finishes its step
        self.threads: list[threading.Thread] = []
        self.step = 0  # the next step the loop asks for; target workers stay within MAX_AHEAD of it
        self._jobs_lock = threading.Lock()
        self._next_job = 0
        self._grads: list[list[torch.Tensor] | None] = [None] * replicas
        self._mean_grads: list[torch.Tensor] = []
        self.thread_tokens_per_s = {f"drafter{i}": 0.0 for i in range(replicas)}
        self.max_pending = 0  # out-of-order work a drafter held at once (bounded by MAX_AHEAD)

    # -- the interface ----------------------------------------------------------------------------
    def warmup(self, buckets: list[int], progress=None) -> list[int]:
        buckets = [b for b in buckets if b not in self.faults.unwarmed]  # what a shape nobody warmed does
        compile_buckets(self.setup, buckets, progress)
        self.gate.warmed = {(index, bucket) for index in range(len(self.setup.replicas)) for bucket in buckets}
        return buckets

    def start(self, step: int) -> None:
        self.step = self._first_step = step
        self.threads = [self._thread(f"target{i}", self._target_worker, i) for i in range(len(self.setup.targets))]
        self.threads += [self._thread(f"drafter{i}", self._drafter_worker, i) for i in range(len(self.setup.replicas))]
        for thread in self.threads:
            thread.start()

    def next(self) -> StepResult:
        step = self.step
        self.step += 1
        for go in self.go:
            go.put(step)
        finished = [self._finished(step) for _ in self.setup.replicas]
        works = [work for _, work in finished]
        stats: dict = {}
        for work in works:  # this process's figures; the loop sums them over processes
            for key, value in work.stats.items():
                stats[key] = stats.get(key, 0) + value
        return StepResult(step + 1, sum(loss for loss, _ in finished) / len(finished),
                          sum(w.useful_tokens for w in works), sum(w.positions for w in works), works[0].bucket, stats,
                          {"world_size": self.world_size, "threads_tokens_per_s": dict(self.thread_tokens_per_s),
                           "gated_compiles": self.gate.exclusive_entries})

    def paused(self):
        """Target workers wait (they prepare under the shared gate); drafters are idle between steps."""
        return self.gate.exclusive()

    def close(self) -> None:
        self.stop.set()
        self.barrier.abort()
        for thread in self.threads:
            thread.join()  # every wait in a worker polls the stop flag

    # -- waiting ----------------------------------------------------------------------------------
    def _finished(self, step: int) -> tuple[float, Work]:
        """One replica's (loss, work) for `step`; a worker's error is raised here, in the loop's thread."""
        # Twice the barrier's timeout: a stalled replica is named by the barrier first; this catches
        # what no barrier sees (a target worker that hangs while every drafter waits for its work).
        deadline = time.monotonic() + 2 * STALL_TIMEOUT_S
        while True:
            if self.errors:
                raise self.errors[0]
            try:
                _, loss, work = self.done.get(timeout=POLL_S)
                return loss, work
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"step {step} made no progress in {2 * STALL_TIMEOUT_S:.0f}s: a worker is stuck; "
                                       f"the run stops here") from None

    def _get(self, q: queue.Queue):
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                continue

    def _put(self, q: queue.Queue, item) -> None:
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                return q.put(item, timeout=POLL_S)
            except queue.Full:
                continue

    def _wait_for_room(self, step: int) -> None:
        while step >= self.step + MAX_AHEAD:
            if self.stop.is_set():
                raise Stopped
            time.sleep(0.005)

    def _barrier(self) -> None:
        try:
            self.barrier.wait(timeout=STALL_TIMEOUT_S)
        except threading.BrokenBarrierError:
            if self.stop.is_set():
                raise Stopped from None
            # Nobody asked to stop: a replica stalled past the timeout or left. That is the run's error.
            raise RuntimeError(f"drafter replicas lost step sync (a replica stalled over {STALL_TIMEOUT_S:.0f}s "
                               f"or exited); the run stops here") from None

    def _thread(self, name: str, body, *args) -> threading.Thread:
        def run():
            try:
                if self.mitigations:
                    threadsafe.apply_dynamo_settings(strict=self.strict_compile)  # per thread (H3)
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
        setup, target = self.setup, self.setup.targets[index]
        replicas = len(setup.replicas)
        while True:
            with self._jobs_lock:
                job, self._next_job = self._next_job, self._next_job + 1
            step, replica = divmod(job, replicas)
            step += self._first_step
            if step >= setup.cfg.steps:
                return
            self._wait_for_room(step)
            if self.faults.inject("target", index, step, self.stop):
                raise Stopped
            with self.gate.shared():  # a foreign trace must not capture the target's module calls (H2)
                work = work_for(setup, step, batch_slot(replica, replicas, self.rank), replicas * self.world_size,
                                target)
            self._put(self.work_queues[replica], work)

    def _drafter_worker(self, index: int) -> None:
        replica = self.setup.replicas[index]
        pending: dict[int, Work] = {}  # work that arrived before its step (target workers finish out of order)
        started, tokens = time.perf_counter(), 0
        while True:
            step = self._get(self.go[index])
            while step not in pending:
                work = self._get(self.work_queues[index])
                pending[work.step] = work
                self.max_pending = max(self.max_pending, len(pending))
            work = pending.pop(step)
            if self.faults.inject("drafter", index, step, self.stop):
                raise Stopped
            with self.gate.for_shape((index, work.bucket)):
                loss = forward_backward(replica, work.inputs)
            self._average_gradients(index, replica)
            replica.apply_gradients()
            loss_value = float(loss.detach())  # host sync once per step
            tokens += work.useful_tokens
            self.thread_tokens_per_s[f"drafter{index}"] = round(tokens / (time.perf_counter() - started), 1)
            self.done.put((index, loss_value, work))

    def _average_gradients(self, index: int, replica) -> None:
        params = [p for p in replica.drafter.parameters() if p.requires_grad]
        self._grads[index] = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self._barrier()
        if index == 0:
            self._mean_grads = mean_across(self._grads, replica.device)
            if self.dist:
                self._mean_grads = all_reduce_mean(self.dist, self._mean_grads, self.world_size)
        self._barrier()
        for param, mean in zip(params, self._mean_grads):
            param.grad = mean.to(param.device, non_blocking=True) if param.device != mean.device else mean.clone()
        self._barrier()  # every replica has its copy before the next step overwrites the mean
