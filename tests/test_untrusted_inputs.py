"""What a user is handed (a cache export, a run dir, a checkpoint, a built target, a lock, a data file) is data.

Each case uses a real payload and checks the promise: one `Error:` line and exit 1 (never a
traceback), no hang (a FIFO, /dev/zero), nothing run (a marker file), nothing lost (a hand edit),
nothing left behind, no output that becomes shell or markdown syntax.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROJECT, run_envkit

ESC = "\x1b"


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert lines, proc.stderr[-2000:]
    return lines[0]


def trainer_cmd(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=PROJECT,
                          timeout=timeout, **kwargs)


def plain_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "uv", "venv", str(path), "-q"], check=True)
    return path


def deeply_nested(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


# -- reads that must not block ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_cache_import_never_hashes_a_fifo_or_a_device(tmp_path, kind):
    source = tmp_path / "cache.zip"
    if kind == "fifo":
        os.mkfifo(source)
    else:
        source.symlink_to("/dev/zero")
    proc = run_envkit("cache", "import", str(source), "--sha256", "0" * 64, "--venv", str(plain_venv(tmp_path / "v")),
                      timeout=30)
    assert "cannot be imported" in one_line_error(proc)


def test_a_run_dir_from_another_host_is_not_running_here_and_logs_f_ends(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "copied"
    run_dir.mkdir(parents=True)
    # Its supervisor pid is alive here (this very process), but on that host it meant another process.
    (run_dir / "run.json").write_text(json.dumps({
        "name": "copied", "status": "running", "host": socket.gethostname() + "-elsewhere", "supervisor_pid": os.getpid(),
        "venv": "/nonexistent", "started_at": "2026-01-01T00:00:00+00:00"}))
    (run_dir / "train.log").write_text("step 1\n")
    listed = json.loads(run_envkit("runs", "--runs-dir", str(runs), "--json", check=True).stdout)
    assert [row["status"] for row in listed] == ["elsewhere"]
    proc = run_envkit("logs", "-f", "copied", "--runs-dir", str(runs), timeout=30)  # a hang fails by timeout
    assert proc.returncode == 0 and "step 1" in proc.stdout


# -- one Error: line, never a traceback ---------------------------------------------------------------------
def test_deeply_nested_json_is_data_not_a_traceback(tmp_path):
    runs = tmp_path / "runs"
    (runs / "deep").mkdir(parents=True)
    (runs / "deep" / "run.json").write_text(json.dumps({"name": "deep", "status": "finished"}))
    (runs / "deep" / "metrics.jsonl").write_text(deeply_nested() + "\n")
    proc = run_envkit("runs", "--runs-dir", str(runs))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "deep" in proc.stdout
    config = tmp_path / "c.json"
    config.write_text(deeply_nested())
    assert "--config" in one_line_error(trainer_cmd("train", "--config", str(config), "--out", str(tmp_path / "o")))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": list(range(40))}) + "\n" + deeply_nested() + "\n")
    error = one_line_error(trainer_cmd("train", "--preset", "tiny", "--data", str(data), "--steps", "1",
                                       "--out", str(tmp_path / "o2")))
    assert f"{data}:2" in error


def test_a_lock_that_is_not_text_is_one_line(tmp_path):
    lock = tmp_path / "binary.toml"
    lock.write_bytes(b"\xff\xfe\x00[profile]\x00\x80")
    assert "not UTF-8 text" in one_line_error(run_envkit("create", "--lock", str(lock), "--venv", str(tmp_path / "v")))
    assert not (tmp_path / "v").exists()


SMALL = {"preset": "tiny", "steps": 1, "compile": False, "eval_every": 0,
         "data": {"buckets": [64], "num_sequences": 8, "eval_sequences": 2}}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A one-step tiny run with its checkpoint (at its last step)."""
    out = tmp_path_factory.mktemp("run") / "run"
    config = out.parent / "config.json"
    config.write_text(json.dumps(SMALL))
    proc = trainer_cmd("train", "--config", str(config), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def resume(tmp_path: Path, finished_run: Path, config: dict, state_change=None) -> subprocess.CompletedProcess:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    if state_change:
        torch = pytest.importorskip("torch")
        state = torch.load(out / "checkpoint.pt", weights_only=True)
        state_change(state, torch)
        torch.save(state, out / "checkpoint.pt")
    (tmp_path / "c.json").write_text(json.dumps(config))
    return trainer_cmd("train", "--config", str(tmp_path / "c.json"), "--out", str(out), "--resume")


def test_resuming_a_run_at_its_last_step_says_so_before_any_work(tmp_path, finished_run):
    error = one_line_error(resume(tmp_path, finished_run, SMALL))
    assert "nothing to resume" in error and "--steps" in error


def test_resuming_from_a_checkpoint_of_another_config_is_one_line(tmp_path, finished_run):
    other = SMALL | {"steps": 3, "drafter": {"block_size": 4}}
    assert "another config" in one_line_error(resume(tmp_path, finished_run, other))


def test_resuming_with_a_malformed_random_state_is_one_line(tmp_path, finished_run):
    def break_rng(state, torch):
        state["rng"]["torch"] = torch.ones(3)
    error = one_line_error(resume(tmp_path, finished_run, SMALL | {"steps": 3}, break_rng))
    assert "random state is malformed" in error


def test_a_state_sent_between_ranks_is_read_weights_only(tmp_path):
    """What rank 0 broadcasts on a restart: checkpoint bytes, never a pickle that runs code where it lands."""
    torch = pytest.importorskip("torch")
    import io

    from trainer import checkpoint
    from trainer.errors import TrainerInputError

    marker = tmp_path / "CODE-RAN"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {shlex.quote(str(marker))}",))

    buffer = io.BytesIO()
    torch.save({"config": {}, "step": 1, "drafter": {}, "layer_ids": [1], "mask_token_id": 0, "x": Payload()}, buffer)
    with pytest.raises(TrainerInputError, match="weights-only"):
        checkpoint.from_bytes(buffer.getvalue(), "rank 0")
    assert not marker.exists()


# -- output that must not become syntax -------------------------------------------------------------------
def test_fix_lines_quote_cache_paths(tmp_path, wheelhouse, test_lock):
    venv = tmp_path / "v"
    run_envkit("create", "--lock", str(test_lock), "--venv", str(venv), "--no-index", "--find-links", str(wheelhouse),
               check=True)
    evil = tmp_path / "x; touch PWNED"
    (evil / "inductor").mkdir(parents=True)
    (evil / "inductor").chmod(0o777)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(evil / "inductor"))
    report = json.loads(run_envkit("doctor", "--venv", str(venv), "--json", env=env).stdout)
    fixes = [f["fix"] for f in report["findings"] if f["id"] == "cache.perms" and f["status"] == "fail"]
    assert fixes
    for fix in fixes:
        for command in fix.split(", or "):
            words = shlex.split(command.replace(" (and remove links)", ""))
            assert any(str(evil) in word for word in words), fix  # the path stays one word


def test_cache_prune_never_reports_a_link_it_did_not_remove(tmp_path):
    root = Path(os.environ["ENVKIT_CACHE_DIR"]) / "compile"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fingerprint.json").write_text(json.dumps({"digest": "x", "venv": "/gone", "key_parts": {}}))
    root.mkdir(parents=True)
    (root / "k").symlink_to(elsewhere)
    pruned = json.loads(run_envkit("cache", "prune", "--json", check=True).stdout)
    assert pruned == []
    assert (elsewhere / "fingerprint.json").exists()


def test_model_card_and_serve_lines_keep_strings_as_data(tmp_path):
    pytest.importorskip("torch")
    from trainer import modelcard
    from trainer.config import tiny

    cfg = tiny()
    cfg.data.path = "rows.jsonl`\n\n## Serve it\n\n<script>alert(1)</script>"
    card = modelcard.render(cfg, 1, [1], 0, {}, None, "float32")
    lines = card.splitlines()
    assert [line for line in lines if line.startswith("## Serve it")] == ["## Serve it"]  # only the card's own
    [data_line] = [line for line in lines if line.startswith("- Data:")]
    assert data_line.count("`") == 2 and "<script>" in data_line  # one code span: shown, never rendered
    out = "/tmp/it's here"
    serve = modelcard.serve_commands("/models/t x", out, 8)
    words = shlex.split(serve["vllm"])
    assert words[2] == "/models/t x" and json.loads(words[-1])["model"] == out
    assert shlex.split(serve["sglang"])[-1] == out


def test_error_lines_never_carry_raw_escape_bytes(tmp_path):
    lock = tmp_path / f"evil{ESC}[2J.toml"
    lock.write_text("[profile\n")
    proc = run_envkit("create", "--lock", str(lock), "--venv", str(tmp_path / "v"))
    assert ESC not in proc.stderr and "\\x1b" in one_line_error(proc)


# -- nothing lost, nothing left behind ----------------------------------------------------------------------
def test_export_force_never_deletes_a_hand_edit(tmp_path, finished_run):
    out = tmp_path / "export"
    ckpt = str(finished_run / "checkpoint.pt")
    assert trainer_cmd("export", "--ckpt", ckpt, "--out", str(out)).returncode == 0
    (out / "README.md").write_text((out / "README.md").read_text() + "\nmy serving notes\n")
    error = one_line_error(trainer_cmd("export", "--ckpt", ckpt, "--out", str(out), "--force"))
    assert "README.md" in error and "changed since the export" in error
    assert "my serving notes" in (out / "README.md").read_text()


def test_a_checkpoint_temp_a_kill_left_is_cleaned_by_the_next_write(tmp_path):
    pytest.importorskip("torch")
    from trainer import checkpoint

    left = tmp_path / ".checkpoint.pt.abc123.tmp"
    left.write_bytes(b"\0" * 4096)  # what a SIGKILL during torch.save leaves
    checkpoint.save(tmp_path / "checkpoint.pt", {"step": 1})
    assert not left.exists() and (tmp_path / "checkpoint.pt").is_file()


def test_the_target_lock_never_follows_a_planted_link(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from trainer import corpus, maketarget
    from trainer.errors import TrainerInputError

    monkeypatch.setenv("ENVKIT_HOME", str(tmp_path / "home"))
    victim = tmp_path / "precious.txt"
    victim.write_text("keep")
    root = maketarget.targets_dir()
    root.mkdir(parents=True)
    key = maketarget.recipe_key("code_tiny", corpus.digest(corpus.files()))
    (root / f".code_tiny-{key}.lock").symlink_to(victim)
    with pytest.raises(TrainerInputError, match="symlink"):
        maketarget.ensure("code_tiny", log=lambda m: None)
    assert victim.read_text() == "keep"


def test_a_built_target_is_checked_against_digests_kept_outside_it(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from trainer import maketarget
    from trainer.errors import TrainerInputError
    from trainer.files import file_sha256

    monkeypatch.setenv("ENVKIT_HOME", str(tmp_path / "home"))
    target = maketarget.targets_dir() / "code_tiny-000000000000"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"weights")
    files = {"config.json": file_sha256(target / "config.json"),
             "model.safetensors": file_sha256(target / "model.safetensors")}
    maketarget._remember(target, {"files": files})
    assert maketarget.check_built(target)["files"] == files
    # Swapped weights, with the target's own manifest rewritten to match: the outside record decides.
    (target / "model.safetensors").write_bytes(b"swapped")
    (target / maketarget.TARGET_MANIFEST).write_text(json.dumps({"files": {
        "config.json": files["config.json"],
        "model.safetensors": file_sha256(target / "model.safetensors")}}))
    with pytest.raises(TrainerInputError, match="changed since it was built"):
        maketarget.check_built(target)
    (target / "model.safetensors").write_bytes(b"weights")
    (target / "extra.json").symlink_to("/etc/passwd")  # transformers would follow it
    with pytest.raises(TrainerInputError, match="not a regular file"):
        maketarget.check_built(target)
    (target / "extra.json").unlink()
    # A target dir this machine never built (no record of ours) is refused.
    other = target.with_name("code_tiny-111111111111")
    target.rename(other)
    with pytest.raises(TrainerInputError, match="no build record"):
        maketarget.check_built(other)
