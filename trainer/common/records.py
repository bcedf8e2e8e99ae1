"""What a run writes, defined once: the rows of metrics.jsonl (a step, a teacher-forced evaluation, the
decoding walk), the summary (summary.json) and how a summary reads to a person. Torch-free: envkit renders a run's summary with the same functions."""

from __future__ import annotations

from typing import TypedDict

# What `export` writes beside the drafter: what was exported from where (trainer/export/dflash.py).
EXPORT_MANIFEST = "envkit-export.json"


class StepRow(TypedDict, total=False):
    """One line of metrics.jsonl per training step (the README's metrics table)."""
    step: int  # steps done, this one included
    epoch: int  # the epoch this step belongs to (0-based)
    rows_seen: int  # training rows trained so far, over every rank and replica (padding rows not counted)
    rows: int  # training rows in this step's batches
    peak_rss_bytes: int  # peak resident host memory of the writing process (rank 0)
    loss: float
    tokens_per_s: float  # every position processed, padding included
    useful_tokens_per_s: float  # real tokens only
    pad_fraction: float
    doc_tokens_sq: int  # sum of squared document lengths: the target's block-diagonal attention, for FLOPs
    anchors: int  # anchors placed
    lr: float
    peak_mem_bytes: int | dict  # per device when a process drives several
    bucket: int  # the padded length of the step's batch
    recompiles: int  # graphs compiled after warm-up (compiles through the compile gate included)
    eager_fallbacks: int  # frames dynamo gave up on and ran eager after warm-up
    graph_breaks: int
    world_size: int  # threaded layout: processes x replicas
    threads_tokens_per_s: dict  # threaded layout: each thread's throughput


class EvalRow(TypedDict):
    """A teacher-forced evaluation line of metrics.jsonl (at step 0, every eval_every steps and at the end)."""
    step: int
    eval: bool  # always True: tells an evaluation from a step row
    method: str  # "teacher_forced"
    acceptance_length: float  # mean over sampled held-out positions of accepted draft tokens + 1
    baseline_repeat_tau: float  # the same positions, drafting by repeating the anchor
    baseline_copy_tau: float  # the same positions, copying what followed the anchor's previous occurrence
    eval_positions: int
    tau_method: str


class WalkRow(TypedDict):
    """The decoding walk's line of metrics.jsonl (at the end of a run; also what `eval --walk` prints)."""
    step: int
    eval: bool  # always True
    method: str  # "walk"
    walk_tau: float  # accepted + 1 per target forward, mean of per-prompt means
    walk_repeat_tau: float
    walk_copy_tau: float
    walk_prompts: int
    walk_new_tokens: int
    walk_degenerate: int  # prompts the target continued degenerately (one token over half): left out of the taus
    walk_counted: int  # prompts the taus are the mean over
    walk_near_ties: int  # divergences from greedy decoding at a near-tie of the target's logits
    walk_verified: int  # prompts also walked with the target verifying each block, checked lossless
    walk_verified_agree: int  # of those, the ones whose acceptance equals the batched walk's exactly
    walk_method: str
    walk_tau_by_prompt: list[float]
    walk_copy_tau_by_prompt: list[float]
    walk_repeat_tau_by_prompt: list[float]
    walk_degenerate_prompts: list[int]  # indices of the prompts left out
    walk_positions: list[float]  # per draft slot k: the share of forwards reaching k that accepted slots 1..k


class Summary(TypedDict):
    """summary.json: the run's result, led by the walk (what serving sees)."""
    summary: bool  # always True: tells the summary line from other JSON lines on stdout
    walk_tau: float  # accepted + 1 per target forward of the greedy speculative decoding walk
    walk_repeat_tau: float  # the same walk, drafting by repeating the anchor
    walk_copy_tau: float  # the same walk, copying what followed the anchor's previous occurrence
    walk_method: str
    walk_prompts: int
    walk_new_tokens: int
    walk_near_ties: int  # divergences from greedy decoding at a near-tie of the target's logits
    walk_degenerate: int  # prompts the target continued degenerately, left out of the walk's taus
    walk_counted: int  # prompts the walk's taus are the mean over
    tau_method: str
    steps: int
    loss_start: float | None
    loss_end: float | None  # the mean of the last log_every steps
    tau_start: float  # teacher-forced, at step 0
    tau_end: float
    baseline_repeat_tau: float  # teacher-forced, on the same positions
    baseline_copy_tau: float
    beats_baselines: bool  # the walk beats both rules
    teacher_forced_beats_baselines: bool
    tokens_per_s: float | None
    useful_tokens_per_s: float | None
    pad_fraction: float | None  # of every position this process's steps processed (tokens_per_s: the last step's)
    recompiles: int
    eager_fallbacks: int
    graph_breaks: int
    world_size: int
    restarts: int  # torchrun restarts of the worker group
    epochs: float  # passes over the training rows done
    rows_seen: int  # training rows trained, over every rank and replica
    peak_rss_bytes_by_rank: dict  # {"rank0": bytes, ...}: each process's peak resident host memory
    walk_by_file: dict  # {file name: {walk_tau, walk_repeat_tau, walk_copy_tau, walk_counted, ...}}: config walk_files
    # and the inductor cache counters: fxgraph_cache_hit/miss/bypass, autograd_cache_hit/miss


def _figure(summary: Summary, key: str, spec: str) -> str:
    """A number of the summary formatted, or n/a (a resumed run with no step left has no end loss)."""
    value = summary.get(key)
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def headline(summary: Summary) -> str:
    """The trainer's last line: the walk against both rules, then the teacher-forced figures and the loss."""
    f = lambda key, spec=".2f": _figure(summary, key, spec)  # noqa: E731
    verdict = "beats both" if summary.get("beats_baselines") else \
        "does NOT beat both baselines: it has learned nothing worth reporting"
    return (f"done: walk tau {f('walk_tau')} (repeat-anchor {f('walk_repeat_tau')}, copy {f('walk_copy_tau')}: "
            f"{verdict}); teacher-forced tau {f('tau_start')} -> {f('tau_end')}; "
            f"loss {f('loss_start', '.3f')} -> {f('loss_end', '.3f')}")


def details(summary: Summary) -> list[str]:
    """A finished run as `envkit train` and `envkit runs` tell it: one indented line a figure."""
    f = lambda key, spec=".2f": _figure(summary, key, spec)  # noqa: E731
    verdict = "beats both baselines" if summary.get("beats_baselines") else \
        "does NOT beat both baselines: nothing worth reporting was learned"
    speed = summary.get("useful_tokens_per_s") or summary.get("tokens_per_s")
    return [
        f"  acceptance length (greedy decoding walk, {summary.get('walk_prompts')} held-out prompts, lossless): "
        f"{f('walk_tau')} (repeat-anchor {f('walk_repeat_tau')}, copy {f('walk_copy_tau')}: {verdict})",
        f"  teacher-forced acceptance length {f('tau_start')} -> {f('tau_end')} "
        f"(repeat-anchor {f('baseline_repeat_tau')}, copy {f('baseline_copy_tau')})",
        *(f"  walk on {name}: {row['walk_tau']:.2f} (repeat-anchor {row['walk_repeat_tau']:.2f}, copy "
          f"{row['walk_copy_tau']:.2f}; {row['walk_counted']} prompts)" for name, row in
          (summary.get("walk_by_file") or {}).items()),
        f"  loss {f('loss_start', '.3f')} -> {f('loss_end', '.3f')}",
        f"  {speed / 1000 if isinstance(speed, (int, float)) else 0:.1f} Ktok/s useful "
        f"(padding {summary.get('pad_fraction') or 0:.0%}), eager fallbacks {summary.get('eager_fallbacks')}, "
        f"recompiles {summary.get('recompiles')}, inductor cache hits {summary.get('fxgraph_cache_hit')} / misses "
        f"{summary.get('fxgraph_cache_miss')}",
    ]
