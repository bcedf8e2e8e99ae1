"""The DFlash serving export, loaded and run by Z Lab's reference implementation (PyPI `dflash`).

The reference is the loader SGLang and vLLM follow: if `DFlashDraftModel.from_pretrained` loads an
export with no missing or unexpected keys and `dflash_generate` decodes losslessly with it, the
format, the layer ids, the mask token and the block layout are right.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PROJECT, one_line_error, record_figure, run_envkit, run_trainer

torch = pytest.importorskip("torch")
dflash_model = pytest.importorskip("dflash.model", reason="make test installs the reference dflash (--no-deps)")
# dflash_generate times itself with torch.cuda.synchronize(); on a CPU-only torch, time without it.
dflash_model._cuda_time = time.perf_counter

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from trainer.config.schema import tiny  # noqa: E402
from trainer.eval.walk import evaluate_walk, repeat_proposer  # noqa: E402
from trainer.export.dflash import export  # noqa: E402
from trainer.model.drafter import SdpaAttention  # noqa: E402
from trainer.train import checkpoint  # noqa: E402
from trainer.train.loop import Trainer  # noqa: E402


def small_trainer(out: Path, **overrides) -> Trainer:
    cfg = tiny()
    cfg.data.num_sequences, cfg.data.eval_sequences = 16, 4
    cfg.steps, cfg.eval_every, cfg.ckpt_every, cfg.compile = 2, 0, 0, False
    cfg.walk_prompts, cfg.walk_new_tokens = 2, 16
    for name, value in overrides.items():
        setattr(cfg, name, value)
    return Trainer.sequential(cfg, out, log=lambda m: None)


def reference_generate(draft, target, prompt: list[int], new_tokens: int):
    return dflash_model.dflash_generate(draft, target, torch.tensor([prompt]), max_new_tokens=new_tokens,
                                        stop_token_ids=None, return_stats=True)


def target_greedy(target, prompt: list[int], new_tokens: int) -> list[int]:
    out = target.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    return out[0, len(prompt):].tolist()


def load_reference(export_dir: Path):
    draft, info = dflash_model.DFlashDraftModel.from_pretrained(export_dir, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    return draft.eval()


def test_export_matches_the_reference_bit_for_bit_and_forward(tmp_path):
    trainer = small_trainer(tmp_path / "run")
    trainer.save_checkpoint()
    out = tmp_path / "export"
    manifest = export(tmp_path / "run" / "checkpoint.pt", out)
    assert {"config.json", "model.safetensors", "envkit-export.json", "target"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8
    assert config["dflash_config"] == {"mask_token_id": trainer.setup.mask_token_id, "target_layer_ids": trainer.setup.layer_ids,
                                       "block_size": 8}
    assert manifest["target"] == "target/"
    trained_with = json.loads((out / "envkit-export.json").read_text())["training_config"]
    assert trained_with["fp8"] == "off" and "compile_target" in trained_with  # how serving's drafter was trained

    draft = load_reference(out)
    saved = load_file(out / "model.safetensors")
    assert not any(k.startswith(("embed", "lm_head")) for k in saved)  # the target's are used
    ours = trainer.setup.replica.drafter.state_dict()  # named as the reference names them
    assert set(saved) == set(ours) == set(draft.state_dict())
    assert all(torch.equal(saved[k], ours[k]) and torch.equal(draft.state_dict()[k], ours[k]) for k in ours)

    target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
    assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), trainer.setup.target.state_dict().values()))

    # The same block through both: context = tapped states before the anchor, block = [anchor, MASK x 7].
    tokens = trainer.setup.eval_data.sequences[0].input_ids[:40]
    anchor = len(tokens) - 1
    with torch.no_grad():
        hidden = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        context = torch.cat([hidden[i + 1] for i in trainer.setup.layer_ids], dim=-1)[:, :anchor]
        block = torch.tensor([[tokens[-1]] + [trainer.setup.mask_token_id] * 7])
        embeds = target.get_input_embeddings()(block)
        mine = trainer.setup.replica.drafter(context, embeds, torch.tensor([[anchor]]), SdpaAttention)
        theirs = draft(position_ids=torch.arange(anchor + 8)[None], noise_embedding=embeds, target_hidden=context)
    assert torch.allclose(mine, theirs, atol=2e-5), (mine - theirs).abs().max()


def family_target(path: Path, family: str) -> Path:
    """A small random model of a family users bring (Llama with tied embeddings, Mistral untied), saved as an HF dir."""
    import transformers

    shapes = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shapes, tie_word_embeddings=True,
                                                                        rope_theta=100_000.0))
    elif family == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**shapes, tie_word_embeddings=False))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=512, n_embd=128, n_layer=2, n_head=4,
                                                                    bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)  # peaked outputs, as the tiny preset's random target
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_a_target_of_another_family_trains_exports_and_serves_losslessly(tmp_path, family):
    target_path = family_target(tmp_path / family, family)
    cfg = tiny()
    cfg.target.path = str(target_path)
    cfg.data.num_sequences, cfg.data.eval_sequences = 16, 4
    cfg.steps, cfg.eval_every, cfg.ckpt_every, cfg.compile = 2, 0, 0, False
    trainer = Trainer.sequential(cfg, tmp_path / "run", log=lambda m: None)
    trainer.train()
    trainer.save_checkpoint()
    out = tmp_path / "export"
    export(tmp_path / "run" / "checkpoint.pt", out)
    config = json.loads((out / "config.json").read_text())
    hf = json.loads((target_path / "config.json").read_text())
    assert config["rope_theta"] == hf.get("rope_theta", hf.get("rope_parameters", {}).get("rope_theta"))
    assert config["hidden_size"] == 128 and config["num_target_layers"] == 6
    draft = load_reference(out)
    target = AutoModelForCausalLM.from_pretrained(target_path).eval()  # a user's target is served from its own dir
    assert target.config.model_type == family
    for prompt in ([5, 17, 99, 3], [400, 2, 2, 31, 7]):
        result = reference_generate(draft, target, prompt, 24)
        assert result.output_ids[0, len(prompt):].tolist() == target_greedy(target, prompt, 24)  # lossless
    trainer.close()


def test_a_target_the_trainer_cannot_drive_is_one_line(tmp_path):
    target_path = family_target(tmp_path / "gpt2", "gpt2")
    proc = run_trainer("train", "--preset", "tiny", "--target", str(target_path), "--steps", "1", "--no-compile",
                       "--out", str(tmp_path / "run"))
    assert "'gpt2' model" in one_line_error(proc) and "llama, mistral, qwen2, qwen3" in one_line_error(proc)


def test_export_refuses_to_clobber_and_writes_nothing_half(tmp_path):
    trainer = small_trainer(tmp_path / "run")
    trainer.save_checkpoint()
    ckpt = tmp_path / "run" / "checkpoint.pt"
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep")
    # Refused before torch is imported or the checkpoint read: in a process where torch cannot be imported.
    cmd = [sys.executable, "-c", "import runpy, sys; sys.modules['torch'] = None; runpy.run_module('trainer', "
           "run_name='__main__', alter_sys=True)", "export", "--ckpt", str(ckpt), "--out", str(precious)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT)
    assert proc.returncode == 1 and "not empty" in proc.stderr and "--force" in proc.stderr
    proc = subprocess.run(cmd + ["--force"], capture_output=True, text=True, cwd=PROJECT)
    assert proc.returncode == 1 and "not an export made by envkit" in proc.stderr
    assert (precious / "notes.txt").read_text() == "keep"
    first = export(ckpt, tmp_path / "exp")
    again = export(ckpt, tmp_path / "exp", force=True)  # a previous export may be replaced
    assert again["files"] == first["files"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp dirs left
    proc = subprocess.run([sys.executable, "-m", "trainer", "export", "--ckpt", str(tmp_path / "nope.pt"), "--out",
                           str(tmp_path / "x")], capture_output=True, text=True, cwd=PROJECT)
    assert proc.returncode == 1 and proc.stderr.startswith("Error: checkpoint") and "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_tiny_run_exports_a_drafter_the_reference_serves_losslessly(tiny_run, tmp_path):
    run_dir, env, stdout = tiny_run
    record = json.loads((run_dir / "run.json").read_text())
    summary = record["summary"]
    # The demo's walk: 2.03-2.31 across runs and machines against the copy rule's 1.45: asserted at half that lead.
    record_figure("tiny demo: walk vs copy", walk=summary["walk_tau"], copy=summary["walk_copy_tau"],
                  repeat=summary["walk_repeat_tau"])
    assert summary["walk_tau"] > 1.25 * summary["walk_copy_tau"] and summary["beats_baselines"], summary
    assert "greedy decoding walk" in stdout  # the summary leads with the walk figure

    out = tmp_path / "served"
    proc = run_envkit("export", "tiny", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"--speculative-draft-model-path {out}" in proc.stdout
    draft = load_reference(out)
    target = AutoModelForCausalLM.from_pretrained(out / "target").eval()

    state = checkpoint.load(run_dir / "checkpoint.pt")
    layer_ids, block = state["layer_ids"], state["config"]["drafter"]["block_size"]
    # Prompts the target continues itself: the random prompts of the preset's held-out data.
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 500, (8,), generator=generator).tolist() for _ in range(8)]
    new_tokens = 48
    per_prompt = []
    for prompt in prompts:
        result = reference_generate(draft, target, prompt, new_tokens)
        assert result.output_ids[0, len(prompt):].tolist() == target_greedy(target, prompt, new_tokens)  # lossless
        per_prompt.append(sum(result.acceptance_lengths) / len(result.acceptance_lengths))
    reference_tau = sum(per_prompt) / len(per_prompt)
    baselines = evaluate_walk(target, repeat_proposer(block), prompts, new_tokens, block, layer_ids)
    assert reference_tau > max(baselines["walk_repeat_tau"], baselines["walk_copy_tau"]), (reference_tau, baselines)
    assert reference_tau > 1.5, reference_tau  # an untrained drafter serves ~1.0


@pytest.mark.e2e
def test_runs_and_export_errors(tiny_run, tmp_path):
    run_dir, env, _ = tiny_run
    [row] = json.loads(run_envkit("runs", "--json", env=env, check=True).stdout)
    assert row["tau_method"] == "walk" and row["acceptance_length"] == json.loads(
        (run_dir / "run.json").read_text())["summary"]["walk_tau"]
    proc = run_envkit("export", "nope", "--out", str(tmp_path / "x"), env=env)
    assert proc.returncode == 1 and "no run named 'nope'" in proc.stderr
    proc = run_envkit("export", str(run_dir), "--out", str(tmp_path / "missing" / "x"), env=env)
    assert proc.returncode == 1 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|> {% if m.role == 'assistant' and enable_thinking is defined and "
            "not enable_thinking %}<nothink> {% endif %}{{ m.content }} <|end|> {% endfor %}")


def make_chat_target(path: Path, *, template: str = TEMPLATE) -> Path:
    """A Qwen3 target dir with a tokenizer trained here on text the test makes (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    words = [f"{a}{b}" for a in "bdgkmpst" for b in "aeiou"]
    text = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(200)]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = ["<unk>", "<|user|>", "<|assistant|>", "<|end|>", "<nothink>"]
    tokenizer.train_from_iterator(text, trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<|end|>")
    fast.chat_template = template
    fast.save_pretrained(path)
    torch.manual_seed(0)
    # Qwen3's embedding has rows beyond its tokenizer; the mask token is chosen among them.
    config = Qwen3Config(vocab_size=len(fast) + 8, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)
    model.save_pretrained(path)
    return path


def conversations(count: int) -> list[dict]:
    words = [f"{a}{b}" for a in "bdgkmpst" for b in "aeiou"]
    rows = []
    for i in range(count):
        question = [words[(i + 3 * j) % len(words)] for j in range(6)]
        answer = [words[(7 * i + 5 * j) % len(words)] for j in range(24)]
        rows.append({"conversations": [{"role": "user", "content": " ".join(question)},
                                       {"role": "assistant", "content": " ".join(answer)}]})
    return rows


@pytest.mark.e2e
def test_chat_path_trains_exports_and_serves(tmp_path):
    from transformers import AutoTokenizer

    target_dir = make_chat_target(tmp_path / "target")
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in conversations(48)))
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "trainer", "train", "--target", str(target_dir), "--data", str(data),
                           "--chat-template-kwargs", '{"enable_thinking": false}', "--steps", "3", "--no-compile",
                           "--out", str(run)], capture_output=True, text=True, cwd=PROJECT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "walk tau" in proc.stdout

    state = checkpoint.load(run / "checkpoint.pt")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    assert state["mask_token_id"] == len(tokenizer)  # Qwen3-style: no mask token, first unused embedding row
    assert state["export"]["chat_template_kwargs"] == {"enable_thinking": False}

    out = tmp_path / "served"
    manifest = export(run / "checkpoint.pt", out)
    assert manifest["target"] == str(target_dir) and not (out / "target").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["chat_template_kwargs"] == {"enable_thinking": False}
    assert config["dflash_config"]["mask_token_id"] == len(tokenizer)
    assert AutoTokenizer.from_pretrained(out).chat_template == TEMPLATE  # the run's tokenizer travels along

    draft = load_reference(out)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    rendered = tokenizer.apply_chat_template(conversations(50)[-1]["conversations"][:1], tokenize=True,
                                             enable_thinking=False)
    prompt = list(rendered if isinstance(rendered, list) else rendered["input_ids"])
    prompt += tokenizer.convert_tokens_to_ids(["<|assistant|>", "<nothink>"])
    result = reference_generate(draft, target, prompt, 24)
    assert result.output_ids[0, len(prompt):].tolist() == target_greedy(target, prompt, 24)


def test_chat_template_kwargs_reach_the_data_and_a_rewriting_template_is_named(tmp_path):
    from transformers import AutoTokenizer

    from trainer.config.schema import DataConfig
    from trainer.data.datasets import load_jsonl
    from trainer.common.errors import TrainerInputError

    target_dir = make_chat_target(tmp_path / "target")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in conversations(4)))
    nothink = tokenizer.convert_tokens_to_ids("<nothink>")
    plain = load_jsonl(str(data), DataConfig(buckets=[64, 128]), 8, tokenizer)
    off = load_jsonl(str(data), DataConfig(buckets=[64, 128], chat_template_kwargs={"enable_thinking": False}), 8,
                     tokenizer)
    assert nothink not in plain.sequences[0].input_ids and nothink in off.sequences[0].input_ids
    # A template that renders earlier turns differently once more follow (as thinking templates do).
    rewriting = "{% for m in messages %}{% if loop.last %}<nothink> {% endif %}<|{{ m.role }}|> {{ m.content }} {% endfor %}"
    tokenizer.chat_template = rewriting
    with pytest.raises(TrainerInputError, match=r"chat.jsonl:1: .*earlier turns change"):
        load_jsonl(str(data), DataConfig(buckets=[64, 128]), 8, tokenizer)


# -- deletion ------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_export_dtype_writes_weights_in_that_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from trainer.config.schema import tiny
    from trainer.train.loop import Trainer

    cfg = tiny()
    cfg.data.num_sequences, cfg.data.eval_sequences, cfg.data.buckets = 8, 2, [64]
    cfg.steps, cfg.compile = 1, False
    ckpt = Trainer.sequential(cfg, tmp_path / "run", log=lambda m: None).save_checkpoint()
    for dtype, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        out = tmp_path / dtype
        proc = subprocess.run([sys.executable, "-m", "trainer", "export", "--ckpt", str(ckpt), "--out", str(out),
                               "--dtype", dtype], cwd=PROJECT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch_dtype}
        assert json.loads((out / "config.json").read_text())["dtype"] == dtype


def test_a_tokenizer_name_in_a_checkpoint_never_reaches_a_hub(tmp_path, checkpoint_path):
    torch = pytest.importorskip("torch")
    state = torch.load(checkpoint_path, weights_only=True)
    state["export"]["tokenizer"] = "Qwen/Qwen3-8B"
    crafted = tmp_path / "checkpoint.pt"
    torch.save(state, crafted)
    proc = run_trainer("export", "--ckpt", str(crafted), "--out", str(tmp_path / "out"),
                       env=dict(os.environ, HF_HUB_OFFLINE="0"))
    assert "not a local directory" in one_line_error(proc)


def test_model_card_and_serve_lines_keep_strings_as_data(tmp_path):
    pytest.importorskip("torch")
    from trainer.export import modelcard
    from trainer.config.schema import tiny

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
