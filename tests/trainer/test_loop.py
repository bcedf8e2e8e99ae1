"""One resolved config, stops at step boundaries, results as files, checkpoints that cannot run code."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ONE_STEP, PROJECT, one_line_error, run_envkit, run_trainer

torch = pytest.importorskip("torch")

from trainer.config.schema import resolve, tiny  # noqa: E402
from trainer.train import checkpoint  # noqa: E402


def test_config_resolution_order_and_partial_files():
    assert resolve(None, {"preset": "tiny"}).to_dict() == tiny().to_dict()  # a preset, not the dataclass defaults
    cfg = resolve("tiny", {"steps": 5, "data": {"buckets": [64]}}, {"batch_size": 4, "steps": 7})
    assert (cfg.steps, cfg.batch_size, cfg.data.buckets, cfg.drafter.block_size) == (7, 4, [64], 8)
    full = resolve(None, cfg.to_dict())  # a run's config.json resolves to itself
    assert full.to_dict() == cfg.to_dict()
    # The chat preset's steps follow from the data (epochs) unless a step count is asked for.
    assert (resolve("chat").epochs, resolve("chat", {"steps": 2}).epochs, resolve("chat", None, {"steps": 2}).epochs,
            resolve("chat", {"steps": 2, "epochs": 1}).epochs) == (3, None, None, 1)
    assert resolve("tiny", {"epochs": 2}, {"steps": 5}).epochs is None  # --steps wins over any epochs
    assert resolve("tiny", None, {"steps": 5, "epochs": 2}).epochs is None


@pytest.mark.parametrize("config, needle", [
    ({"stepz": 3}, "unknown config key 'stepz'"),
    ({"data": {"sourc": "random"}}, "unknown config key data.sourc"),
    ({"data": {"source": "web"}}, "data.source must be generate, corpus, random, chat_lengths or file"),
    ({"dtype": "fp8"}, "dtype must be float32, bfloat16 or float16"),
])
def test_bad_config_names_the_key(tmp_path, config, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    proc = run_trainer("describe", "--config", str(path))
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_describe_reports_what_torch_reports_without_importing_it():
    """describe keys every compile cache: on a CPU-only build it reads torch/version.py and the CPU's flags
    (trainer/common/torch_build.py) instead of importing torch, and must say what torch itself says; with
    ATEN_CPU_CAPABILITY set it asks torch."""
    truth = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps([str(torch.__version__), "
                            "torch.version.cuda, torch.cuda.is_available(), torch.backends.cpu.get_cpu_capability()]))"],
                           capture_output=True, text=True, check=True)
    version, cuda, has_gpu, capability = json.loads(truth.stdout)
    if cuda is not None or has_gpu:
        pytest.skip("a torch built for an accelerator is described by torch itself")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "trainer", "describe", "--preset", "tiny"],
                          capture_output=True, text=True, cwd=PROJECT)
    described = json.loads(proc.stdout)
    assert (described["torch"], described["cuda"], described["device"]) == (version, None, f"cpu ({capability})")
    assert not [line for line in proc.stderr.splitlines() if line.endswith("| torch")], "describe imported torch"
    forced = run_trainer("describe", "--preset", "tiny", env=dict(os.environ, ATEN_CPU_CAPABILITY="default"))
    assert json.loads(forced.stdout)["device"] == "cpu (DEFAULT)"


@pytest.mark.e2e
def test_checkpoints_never_unpickle_code(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 1, "payload": os.system}, path)  # a callable is pickled by reference: code on load
    with pytest.raises(Exception, match="[Ww]eights only"):
        checkpoint.load(path)


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


# A run that checkpoints every 2 steps and logs each one.
CHECKPOINT_EVERY_2 = {"preset": "tiny", "compile": False, "eval_every": 0, "ckpt_every": 2, "log_every": 1,
                      "walk_prompts": 1, "walk_new_tokens": 8,
                      "data": {"buckets": [64], "num_sequences": 32, "eval_sequences": 2}}
SMALL = {"preset": "tiny", "data": {"num_sequences": 32, "eval_sequences": 4}, "walk_prompts": 2,
         "walk_new_tokens": 16, "eval_every": 0}


def _rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of torchrun's worker with LOCAL_RANK=rank."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher_pid and f"LOCAL_RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no rank {rank} under pid {launcher_pid}")


TRAINER = (sys.executable, "-m", "trainer")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "trainer")
# What `--gpus 2` runs, without needing two CUDA devices: the trainer starts torchrun itself, ranks on CPU with gloo.
LAUNCHER = (sys.executable, "-m", "trainer")
LAUNCHER_ARGS = ("--nproc-per-node", "2")


def _stop_mid_run(out: Path, *extra: str, command: tuple[str, ...] = TRAINER, rank: int | None = None):
    """SIGTERM after three logged steps: to the command, or to one torchrun rank only."""
    proc = subprocess.Popen([*command, "train", "--out", str(out), "--steps", "100000", "--no-compile", *extra],
                            cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").exists() and sum('"loss"' in line for line in
                                                    (out / "metrics.jsonl").read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    os.kill(proc.pid if rank is None else _rank_pid(proc.pid, rank), signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.e2e
@pytest.mark.parametrize("layout", [(), ("--targets", "cpu", "--drafters", "cpu,cpu")], ids=["sequential", "threads"])
def test_sigterm_stops_at_a_step_boundary_and_resume_is_exact(tmp_path, layout):
    out = tmp_path / "run"
    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    layout = ("--config", str(tmp_path / "small.json"), *layout)
    proc = _stop_mid_run(out, *layout)
    assert proc.returncode == 143, proc.stderr[-2000:]
    state = checkpoint.load(out / "checkpoint.pt")
    steps = [row["step"] for row in _metrics(out) if "loss" in row]
    # The checkpoint holds exactly the steps whose rows were written: none half-applied, none lost.
    assert steps == list(range(1, state["step"] + 1))
    assert f"interrupted at step {state['step']}" in proc.stdout
    if "--drafters" in layout:
        assert "replicas identical: True" in proc.stdout
    resumed = run_trainer("train", "--out", str(out), "--steps", str(state["step"] + 2), "--no-compile", "--resume",
                      *layout)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    steps = [row["step"] for row in _metrics(out) if "loss" in row]
    assert steps == list(range(1, state["step"] + 3))  # continues with the next step, none re-trained
    assert json.loads((out / "summary.json").read_text())["steps"] == state["step"] + 2


@pytest.mark.e2e
@pytest.mark.parametrize("command,rank,extra", [(TORCHRUN, 1, ()), (LAUNCHER, None, LAUNCHER_ARGS)],
                         ids=["torchrun, one rank", "--nproc-per-node"])
def test_ranks_stop_after_the_same_step(tmp_path, command, rank, extra):
    """SIGTERM to one torchrun rank only, or to the trainer that started torchrun (which hands it to every rank): the
    ranks agree on the step to stop after, so none waits in an all-reduce for a partner that has left,
    and rank 0 checkpoints exactly the steps it logged."""
    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    out = tmp_path / "run"
    proc = _stop_mid_run(out, "--config", str(tmp_path / "small.json"), *extra, command=command, rank=rank)
    stopped = [line for line in proc.stdout.splitlines() if line.startswith("interrupted at step")]
    assert len(stopped) == 2, proc.stdout + proc.stderr[-3000:]
    assert len({line.split()[3] for line in stopped}) == 1, stopped  # the same step on both ranks
    state = checkpoint.load(out / "checkpoint.pt")
    assert [row["step"] for row in _metrics(out) if "loss" in row] == list(range(1, state["step"] + 1))
    if command is LAUNCHER:
        assert proc.returncode == 143, proc.stderr[-2000:]


@pytest.mark.e2e
def test_trainer_arguments_reach_warm_up_and_run_json(cpu_venv, warm_cache_root, tmp_path):
    root = tmp_path / "cache-root"
    shutil.copytree(warm_cache_root, root, symlinks=True)
    env = dict(os.environ, ENVKIT_CACHE_DIR=str(root), ENVKIT_RUNS_DIR=str(tmp_path / "runs"))
    # The file says batch 4, the argument 8: a warm-up that missed the argument would compile batch 4 and the run
    # would miss. One bucket of 64 and a short evaluation (the shapes the in-process compile tests use, so their
    # kernels are built once in the run: tests/tools/g++).
    config = tmp_path / "one-bucket.json"
    config.write_text(json.dumps({"preset": "tiny", "batch_size": 4, "walk_prompts": 2, "walk_new_tokens": 16,
                                  "data": {"buckets": [64], "num_sequences": 64, "eval_sequences": 4}}))
    proc = run_envkit("train", "--venv", str(cpu_venv), "--config", str(config), "--name", "b8", "--",
                      "--batch-size", "8", "--steps", "3", env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "b8"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["config"]["batch_size"] == 8
    assert json.loads((run_dir / "config.json").read_text())["batch_size"] == 8
    assert "--config" in record["command"] and str(run_dir / "config.json") in record["command"]
    # Warmed for batch 8 by this very command: the run itself only hits.
    assert record["summary"]["fxgraph_cache_miss"] == 0 and record["summary"]["fxgraph_cache_hit"] > 0
    assert record["summary"] == json.loads((run_dir / "summary.json").read_text())


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def resume(tmp_path: Path, finished_run: Path, config: dict, state_change=None) -> subprocess.CompletedProcess:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    if state_change:
        torch = pytest.importorskip("torch")
        state = torch.load(out / "checkpoint.pt", weights_only=True)
        state_change(state, torch)
        torch.save(state, out / "checkpoint.pt")
    (tmp_path / "c.json").write_text(json.dumps(config))
    return run_trainer("train", "--config", str(tmp_path / "c.json"), "--out", str(out), "--resume")


@pytest.mark.parametrize("args, needle", [
    (("train", "--no-mitigations"), "this run has no threads"),
    (("train", "--fail-at", "drafter:0:1"), "--fail-at injects"),
    (("train", "--device", "cpu", "--targets", "cpu"), "not both"),
    (("warmup", "--strict-compile"), "only apply to `train`"),
    (("warmup", "--no-compile"), "nothing to warm"),
    (("train", "--ou", "x"), "unrecognized arguments: --ou"),  # no abbreviation slips past envkit's reserved --out
])
def test_a_flag_a_layout_cannot_honour_is_refused(tmp_path, args, needle):
    proc = run_trainer(*args, "--out", str(tmp_path / "o"), "--steps", "1")
    assert proc.returncode in (1, 2) and needle in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_walk_ablations_without_the_walk_are_refused_before_the_checkpoint_is_read(tmp_path):
    absent = str(tmp_path / "absent.pt")  # named, never read: the flags are wrong whatever it holds
    for flag in (("--taps", "0"), ("--zero-context",), ("--prompts", str(tmp_path / "prompts.jsonl"))):
        assert "give --walk too" in one_line_error(run_trainer("eval", "--ckpt", absent, *flag))


@pytest.mark.e2e
def test_strict_compile_in_the_sequential_layout_stops_at_a_recompile(tmp_path, monkeypatch):
    """The sequential layout honours --strict-compile: a shape compiled after warm-up stops the run."""
    pytest.importorskip("torch")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from trainer.config.schema import tiny
    from trainer.train.loop import Trainer

    def trainer_skipping_warmup(strict: bool) -> Trainer:
        cfg = tiny()
        cfg.data.buckets, cfg.data.num_sequences, cfg.data.eval_sequences = [64], 16, 2
        cfg.steps, cfg.log_every, cfg.eval_every, cfg.ckpt_every, cfg.walk_prompts, cfg.walk_new_tokens = \
            2, 1, 0, 0, 1, 8
        cfg.compile = True
        run = Trainer.sequential(cfg, tmp_path / f"run-{strict}", log=lambda m: None, strict_compile=strict)
        run.executor.warmup = lambda buckets, progress=None: []  # a bucket nobody warmed: the first step compiles
        return run

    strict = trainer_skipping_warmup(True)
    with pytest.raises(RuntimeError, match="--strict-compile: 1 recompiles"):
        strict.train()
    strict.close()
    import torch

    torch._dynamo.reset()  # the strict run's graph stays in dynamo's memory otherwise, and nothing recompiles
    lenient = trainer_skipping_warmup(False)
    summary = lenient.train()
    lenient.close()
    assert summary["recompiles"] >= 1


@pytest.mark.e2e
def test_a_second_signal_exits_at_once_and_writes_no_checkpoint(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps(CHECKPOINT_EVERY_2))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config), "--out", str(out),
                             "--steps", "100000"], cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ((out / "checkpoint.pt").exists() and len(metrics(out)) >= 5):
        time.sleep(0.02)
    before = (out / "checkpoint.pt").read_bytes()
    # Two signals at once (two SIGINTs would merge into one pending signal): the first asks for a stop at the
    # next step boundary, the second is handled before the loop gets there.
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    assert "no checkpoint written" in stdout and "Traceback" not in stderr
    assert (out / "checkpoint.pt").read_bytes() == before  # the checkpoint of an earlier boundary, untouched

    from trainer.train import checkpoint

    state = checkpoint.load(out / "checkpoint.pt")
    saved_step = state["step"]
    assert saved_step % 2 == 0 and saved_step >= 2  # written at a ckpt_every boundary, never mid-step
    # The checkpoint is a consistent step: resuming from it gives exactly the losses the run had after it.
    seen = {row["step"]: row["loss"] for row in metrics(out)}
    resumed = subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(config), "--out", str(out),
                              "--steps", str(saved_step + 2), "--resume"], cwd=PROJECT, capture_output=True,
                             text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    redone = [row for row in metrics(out) if row["step"] > saved_step][-2:]
    assert [row["step"] for row in redone] == [saved_step + 1, saved_step + 2]
    for row in redone:
        if row["step"] in seen:
            assert row["loss"] == pytest.approx(seen[row["step"]], abs=1e-5)


# -- silent wrong results and tracebacks -----------------------------------------------------------
@pytest.mark.parametrize("change, needle", [
    ({"drafter": {"gamma": 0}}, "drafter.gamma must be greater than 0"),
    ({"grad_clip": -1}, "grad_clip must be greater than 0"),
    ({"walk_prompts": 0}, "walk_prompts must be at least 1"),
    ({"steps": 0}, "steps must be at least 1"),
    ({"log_every": 0}, "log_every must be at least 1"),
    ({"batch_size": 8.5}, "batch_size must be int"),
    ({"lm_head_chunk": 0}, "lm_head_chunk must be at least 1"),
    ({"lr": "fast"}, "lr must be float"),
])
def test_config_values_are_checked_where_they_are_read(tmp_path, change, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"preset": "tiny", **change}))
    assert needle in one_line_error(run_trainer("describe", "--config", str(path)))


@pytest.mark.e2e
def test_a_non_finite_loss_fails_the_run_naming_the_step(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"preset": "tiny", "steps": 50, "compile": False, "lr": 1e30, "warmup_frac": 0,
                                  "eval_every": 0, "log_every": 1, "data": {"buckets": [64], "num_sequences": 16}}))
    proc = run_trainer("train", "--config", str(config), "--out", str(tmp_path / "o"))
    error = one_line_error(proc)
    assert "the loss is" in error and "at step" in error
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("state, needle", [
    ({"step": 1}, "no valid 'config'"),
    ({"config": {}, "step": 1, "drafter": {"fc.weight": "int"}, "layer_ids": [1], "mask_token_id": 0},
     "not a finite floating-point tensor"),
    ("pickle", "Weights only load failed"),
])
def test_crafted_checkpoints_are_one_line_errors(tmp_path, state, needle):
    torch = pytest.importorskip("torch")
    path = tmp_path / "checkpoint.pt"
    if state == "pickle":
        torch.save({"payload": os.system}, path)
    else:
        if isinstance(state.get("drafter"), dict):
            state["drafter"] = {"fc.weight": torch.ones(2, dtype=torch.int64)}
        torch.save(state, path)
    assert needle in one_line_error(run_trainer("export", "--ckpt", str(path), "--out", str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_resuming_a_run_at_its_last_step_says_so_before_any_work(tmp_path, finished_run):
    error = one_line_error(resume(tmp_path, finished_run, ONE_STEP))
    assert "nothing to resume" in error and "--steps" in error


def test_resuming_from_a_checkpoint_of_another_config_is_one_line(tmp_path, finished_run):
    other = ONE_STEP | {"steps": 3, "drafter": {"block_size": 4}}
    assert "another config" in one_line_error(resume(tmp_path, finished_run, other))


def test_resuming_with_a_malformed_random_state_is_one_line(tmp_path, finished_run):
    def break_rng(state, torch):
        state["rng"]["torch"] = torch.ones(3)
    error = one_line_error(resume(tmp_path, finished_run, ONE_STEP | {"steps": 3}, break_rng))
    assert "random state is malformed" in error


def test_a_state_sent_between_ranks_is_read_weights_only(tmp_path):
    """What rank 0 broadcasts on a restart: checkpoint bytes, never a pickle that runs code where it lands."""
    torch = pytest.importorskip("torch")
    import io

    from trainer.train import checkpoint
    from trainer.common.errors import TrainerInputError

    marker = tmp_path / "CODE-RAN"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {shlex.quote(str(marker))}",))

    buffer = io.BytesIO()
    torch.save({"config": {}, "step": 1, "drafter": {}, "layer_ids": [1], "mask_token_id": 0, "x": Payload()}, buffer)
    with pytest.raises(TrainerInputError, match="weights-only"):
        checkpoint.from_bytes(buffer.getvalue(), "rank 0")
    assert not marker.exists()


def test_a_checkpoint_temp_a_kill_left_is_cleaned_by_the_next_write(tmp_path):
    pytest.importorskip("torch")
    from trainer.train import checkpoint

    left = tmp_path / ".checkpoint.pt.abc123.tmp"
    left.write_bytes(b"\0" * 4096)  # what a SIGKILL during torch.save leaves
    checkpoint.save(tmp_path / "checkpoint.pt", {"step": 1})
    assert not left.exists() and (tmp_path / "checkpoint.pt").is_file()
