"""What the trainer does about each torch hazard (HAZARDS.md), and the self-test that proves it.

Torch-free on purpose: envkit's doctor imports this table without starting torch. The self-tests
themselves live in trainer/safety/selftest.py and run inside the managed venv (`python -m trainer selftest`):
each reproduces the hazard with the mitigation off and shows it gone with the mitigation on, so
"mitigated" is something a venv proved, not something a file's presence implies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mitigation:
    hazard: str  # H1..H8, as in HAZARDS.md
    mitigation: str  # what the trainer (or envkit around it) does
    where: str  # the code that does it, relative to the project root
    selftest: str  # the name of the self-test in trainer/safety/selftest.py


MITIGATIONS = {m.hazard: m for m in (
    Mitigation("H1", "thread-aware FX tracing check installed before anything compiles",
               "trainer/safety/threadsafe.py install()", "compiled_call_under_foreign_trace"),
    Mitigation("H2", "compile gate: no trace overlaps another thread's forward or backward pass",
               "trainer/safety/threadsafe.py CompileGate", "module_call_under_foreign_trace"),
    Mitigation("H3", "dynamo settings applied at the start of every worker thread",
               "trainer/safety/threadsafe.py apply_dynamo_settings()", "dynamo_settings_in_worker_thread"),
    Mitigation("H4", "sequences padded to fixed length buckets, each compiled once before training",
               "trainer/data/datasets.py", "bucketed_shapes_compile_once"),
    Mitigation("H5", "envkit points TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR at a private 0700 dir",
               "envkit/trainerproc/process.py trainer_env()", "private_compile_cache"),
    Mitigation("H6", "warmers serialise on a file lock held around the whole warm-up",
               "envkit/cache/warmup.py warm()", "warm_lock_is_held"),
    Mitigation("H7", "CPU trains through SDPA with a dense mask from the same rule",
               "trainer/model/drafter.py pick_attention()", "cpu_attention_has_backward"),
    Mitigation("H8", "compile-health monitor counts eager fallbacks in every metrics row",
               "trainer/metrics/monitor.py", "eager_fallback_is_counted"),
)}

# The warm lock's path, handed to the self-test so that it can show the lock is held (H6).
WARM_LOCK_ENV = "ENVKIT_WARM_LOCK"
