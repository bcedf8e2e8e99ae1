"""Threads across devices (CPU here): the pipeline's behaviour. The H1/H2 races themselves are reproduced and shown
mitigated by the trainer's self-tests (tests/test_selftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from trainer.train.faults import Faults  # noqa: E402

from helpers import PROJECT

@pytest.fixture(autouse=True)
def private_inductor_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "inductor"))


def test_the_tracing_thread_still_sees_its_own_trace():
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(PROJECT)!r})
        from trainer.safety import threadsafe
        threadsafe.install()
        double = torch.compile(lambda x: x * 2)
        class Nested(torch.nn.Module):
            def forward(self, x):
                return double(x)
        try:
            torch.fx.symbolic_trace(Nested())
            print("traced")
        except RuntimeError as exc:
            print("detected" if "symbolically trace" in str(exc) else exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert out.strip() == "detected"


def small_threaded(tmp_path, **kwargs):
    from trainer.config.schema import tiny
    from trainer.train.loop import Trainer

    cfg = tiny()
    cfg.data.buckets, cfg.data.num_sequences, cfg.data.eval_sequences = [64], 32, 4
    cfg.steps, cfg.log_every, cfg.eval_every, cfg.ckpt_every = kwargs.pop("steps", 30), 10, 0, 0
    cfg.compile = kwargs.pop("compile", True)
    return Trainer.threaded(cfg, tmp_path / "run", targets=["cpu"], drafters=["cpu", "cpu"], log=lambda m: None,
                            **kwargs)


@pytest.mark.e2e
def test_two_drafter_threads_compiled_no_fallbacks_identical_replicas(tmp_path):
    from trainer.data.datasets import collate
    from trainer.train.gradients import weights_digest
    from trainer.train.steps import step_inputs

    trainer = small_threaded(tmp_path)
    summary = trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 30 and summary["steps"] == 30
    assert all(r["eager_fallbacks"] == 0 and r["recompiles"] == 0 for r in steps)
    assert set(steps[-1]["threads_tokens_per_s"]) == {"drafter0", "drafter1"}
    digests = {weights_digest(r.drafter) for r in trainer.setup.replicas}
    assert len(digests) == 1  # bit-identical

    # A shape outside the buckets compiles under the exclusive gate while another thread runs the target.
    import threading

    stop = threading.Event()
    errors = []
    setup, gate = trainer.setup, trainer.executor.gate

    def forwards():
        batch = setup.train_data.bucket_batch(64, 2)
        while not stop.is_set():
            try:
                with gate.shared():
                    step_inputs(setup, batch, torch.Generator().manual_seed(0))
            except Exception as exc:  # pragma: no cover - the failure this test exists to catch
                errors.append(exc)
                return

    other = threading.Thread(target=forwards)
    other.start()
    try:
        replica = setup.replicas[0]
        odd = collate([[seq] for seq in setup.train_data.sequences[:2]], 96)
        with gate.for_shape((0, 96)) as compiling:
            replica.loss_fn(step_inputs(setup, odd, torch.Generator().manual_seed(1)).to(replica.device)).backward()
    finally:
        stop.set()
        other.join()
    assert compiling and not errors
    assert trainer.monitor.since_warm()["recompiles"] >= 1 and gate.exclusive_entries == 1
    trainer.close()


def test_a_failing_drafter_thread_ends_the_run_quickly(tmp_path):
    from trainer.train.faults import InjectedFailure

    trainer = small_threaded(tmp_path, steps=10_000, compile=False, faults=Faults.parse("drafter:1:3"))
    with pytest.raises(InjectedFailure):
        trainer.train()
    assert trainer.step_count <= 3  # the loop stopped at the failing step, it did not train on without a replica
    trainer.close()


@pytest.mark.parametrize("stalled,error", [
    ("drafter:1:3:stall", "lost step sync"),  # the other replica waits at the gradient barrier
    ("target:0:3:stall", "step 3 made no progress"),  # every drafter waits for work no one will send
], ids=["replica", "target worker"])
def test_a_stalled_worker_is_an_error_not_a_hang(tmp_path, monkeypatch, stalled, error):
    from trainer.train import executors

    monkeypatch.setattr(executors, "STALL_TIMEOUT_S", 2.0)
    trainer = small_threaded(tmp_path, steps=10_000, compile=False, faults=Faults.parse(stalled))
    with pytest.raises(RuntimeError, match=error):  # raised, so no hang (pytest-timeout would end one)
        trainer.train()
    assert trainer.step_count <= 3
    assert not any(t.is_alive() for t in trainer.executor.threads)  # train() joined them on the way out
    trainer.close()


@pytest.mark.e2e
def test_a_slow_target_worker_keeps_out_of_order_results_bounded(tmp_path):
    from trainer.config.schema import tiny
    from trainer.train.executors import MAX_AHEAD
    from trainer.train.loop import Trainer

    cfg = tiny()
    cfg.data.buckets, cfg.data.num_sequences, cfg.data.eval_sequences = [64], 32, 4
    cfg.steps, cfg.eval_every, cfg.ckpt_every, cfg.compile = 40, 0, 0, False
    cfg.walk_prompts, cfg.walk_new_tokens = 1, 8
    trainer = Trainer.threaded(cfg, tmp_path / "run", targets=["cpu", "cpu", "cpu"], drafters=["cpu"],
                               log=lambda m: None, faults=Faults.parse("target:0:2:slow"))
    trainer.train()
    assert trainer.step_count == 40
    assert 1 <= trainer.executor.max_pending <= MAX_AHEAD + 1
    trainer.close()


def small_config(tmp_path) -> str:
    """The tiny preset's model with a little data and a short walk: these runs check processes, not learning."""
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"preset": "tiny", "data": {"num_sequences": 32, "eval_sequences": 4},
                                "walk_prompts": 2, "walk_new_tokens": 16, "eval_every": 0}))
    return str(path)


@pytest.mark.e2e
def test_failure_exits_nonzero_with_the_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainer", "train", "--config", small_config(tmp_path), "--out",
                           str(tmp_path / "o"), "--no-compile", "--steps", "50", "--targets", "cpu", "--drafters",
                           "cpu,cpu", "--fail-at", "target:0:2"],
                          capture_output=True, text=True, cwd=PROJECT, timeout=300)
    assert proc.returncode != 0
    assert "InjectedFailure" in proc.stderr and "Traceback" in proc.stderr


@pytest.mark.e2e
def test_torchrun_two_ranks_on_cpu(tmp_path):
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "trainer", "train", "--config", small_config(tmp_path), "--steps", "20",
                           "--no-compile", "--out", str(out)], capture_output=True, text=True, cwd=PROJECT, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    digests = {line.split("sha256 ")[1].split(",")[0] for line in proc.stdout.splitlines() if "drafter weights" in line}
    ranks = [line for line in proc.stdout.splitlines() if "drafter weights" in line]
    assert len(ranks) == 2 and len(digests) == 1, proc.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["world_size"] for r in rows if "loss" in r} == {2}


@pytest.mark.parametrize("spec", ["x:1:2", "drafter:1", "drafter:a:2", "drafter:1:2:boom", "drafter:1:2:slow:9"])
def test_a_malformed_fail_at_is_an_input_error_naming_the_form(spec):
    from trainer.common.errors import TrainerInputError

    with pytest.raises(TrainerInputError, match=re.escape("target|drafter:INDEX:STEP[:stall|slow]")):
        Faults.parse(spec)
    assert Faults.parse("target:0:2:slow").fail_at == ("target", 0, 2, "slow")
