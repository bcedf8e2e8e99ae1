"""The bundled trainer on CPU with real torch: masks, backends, loss, resume, checkpoints, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainer.train import checkpoint  # noqa: E402

from trainer.common import records  # noqa: E402
from trainer.config.schema import TrainConfig, qwen3_8b, tiny  # noqa: E402
from trainer.model.drafter import FlexAttention, SdpaAttention, build_drafter  # noqa: E402
from trainer.model.loss import block_targets, sample_anchors, slot_weights  # noqa: E402
from trainer.model.masks import dense_mask, make_mask_mod  # noqa: E402

from helpers import PROJECT


def small_config(**overrides) -> TrainConfig:
    cfg = tiny()
    cfg.data.num_sequences, cfg.data.eval_sequences = 32, 4
    cfg.steps, cfg.log_every, cfg.eval_every, cfg.ckpt_every = 6, 2, 0, 3
    cfg.compile = False  # compiling is warm-cache's business (tests/test_cache.py)
    for name, value in overrides.items():
        setattr(cfg, name, value)
    return cfg


def random_anchors(batch=3, blocks=5, context=40, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randint(0, context, (batch, blocks), generator=g).sort(dim=1).values
    anchors[0, -2:] = -1  # padding blocks
    anchors[2, :] = -1  # a sequence with no anchor at all
    return anchors


def test_dense_mask_equals_flex_mask_mod():
    from torch.nn.attention.flex_attention import create_mask

    for seed in range(3):
        anchors, context, block = random_anchors(seed=seed), 40, 4
        dense = dense_mask(anchors, context, block)
        q_len = anchors.shape[1] * block
        flex = create_mask(make_mask_mod(anchors, context, block), anchors.shape[0], 1, q_len, context + q_len)
        assert torch.equal(dense, flex[:, 0])


def test_dense_mask_rule():
    anchors = torch.tensor([[5, -1]])
    mask = dense_mask(anchors, context_len=8, block_size=2)  # (1, 4, 12)
    assert mask[0, 0, :5].all() and not mask[0, 0, 5:8].any()  # context strictly before anchor 5
    assert mask[0, 0, 8:10].all() and not mask[0, 0, 10:].any()  # its own block only
    assert not mask[0, 2:].any()  # the padding block sees nothing


def test_flex_and_sdpa_agree_on_cpu_forward():
    torch.manual_seed(0)
    anchors, context, block = random_anchors(), 40, 4
    q = torch.randn(3, 4, anchors.shape[1] * block, 16)
    k = torch.randn(3, 2, context + anchors.shape[1] * block, 16)
    v = torch.randn_like(k)
    with torch.no_grad():
        sdpa = SdpaAttention.attend(q, k, v, SdpaAttention.prepare(anchors, context, block))
        flex = FlexAttention.attend(q, k, v, FlexAttention.prepare(anchors, context, block))
    # Rows of padding blocks see nothing: SDPA zeroes them; flex's output there is 0 too.
    torch.testing.assert_close(sdpa, flex, atol=1e-5, rtol=1e-4)


def test_whole_drafter_agrees_across_backends():
    """The same drafter with flex (forward only on CPU) and SDPA gives the same hidden states."""
    cfg = small_config()
    torch.manual_seed(0)
    drafter = build_drafter(cfg.drafter, cfg.target, num_taps=1)
    anchors = random_anchors(context=64)
    tapped = torch.randn(3, 64, cfg.target.hidden_size)
    embeds = torch.randn(3, anchors.shape[1] * cfg.drafter.block_size, cfg.target.hidden_size)
    with torch.no_grad():
        sdpa = drafter(tapped, embeds, anchors, SdpaAttention)
        flex = drafter(tapped, embeds, anchors, FlexAttention)
    live = (anchors >= 0).repeat_interleave(cfg.drafter.block_size, dim=1)  # padding rows differ by design
    torch.testing.assert_close(sdpa[live], flex[live], atol=1e-4, rtol=1e-4)


def test_sdpa_gradients_are_finite_with_padding_blocks():
    cfg = small_config()
    drafter = build_drafter(cfg.drafter, cfg.target, num_taps=1)
    anchors = random_anchors(context=64)
    tapped = torch.randn(3, 64, cfg.target.hidden_size)
    embeds = torch.randn(3, anchors.shape[1] * cfg.drafter.block_size, cfg.target.hidden_size)
    drafter(tapped, embeds, anchors, SdpaAttention).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in drafter.parameters() if p.grad is not None)


def test_anchor_sampling_respects_padding_and_sequence_ends():
    block = 4
    loss_mask = torch.zeros(2, 20, dtype=torch.bool)
    loss_mask[0, 6:12] = True  # supervised span inside a 12-token sequence
    loss_mask[1, :] = True
    lengths = torch.tensor([12, 9])
    anchors = sample_anchors(loss_mask, lengths, 30, block, torch.Generator().manual_seed(0))
    row0 = anchors[0][anchors[0] >= 0]
    assert row0.tolist() == sorted(set(row0.tolist())) and len(row0) > 0
    assert all(5 <= a and a + block - 1 < 12 for a in row0.tolist())
    row1 = anchors[1][anchors[1] >= 0]
    assert row1.tolist() == list(range(0, 9 - block + 1))  # every position whose continuation fits


def test_block_targets_and_weights():
    input_ids = torch.arange(100, 120)[None]
    loss_mask = torch.ones(1, 20, dtype=torch.bool)
    loss_mask[0, 15:] = False
    anchors = torch.tensor([[3, 13, -1]])
    block_ids, labels, weights = block_targets(input_ids, loss_mask, torch.tensor([18]), anchors, 4, 2.0, 7)
    assert block_ids[0, :4].tolist() == [103, 7, 7, 7]
    assert labels[0, :4].tolist() == [103, 104, 105, 106]
    w = slot_weights(4, 2.0)
    assert w[0] == 0 and torch.allclose(w[1:], torch.exp(-torch.arange(3.0) / 2.0))
    assert torch.allclose(weights[0, :4], w)
    assert weights[0, 4:8].tolist()[:2] == pytest.approx(w[:2].tolist()) and weights[0, 6:8].tolist() == [0, 0]
    assert weights[0, 8:].sum() == 0  # the padding block


@pytest.mark.e2e
def test_resume_gives_the_same_losses(tmp_path):
    from trainer.train.loop import Trainer

    def losses(path: Path) -> list[float]:
        return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r]

    whole = Trainer.sequential(small_config(), tmp_path / "whole", log=lambda m: None)
    whole.train()
    whole.close()
    part = Trainer.sequential(small_config(), tmp_path / "part", log=lambda m: None)
    for _ in range(3):  # the same run, stopped after three steps
        part._write(part.step())
    part.save_checkpoint()
    part.close()
    resumed = Trainer.sequential(small_config(), tmp_path / "part", resume=True, log=lambda m: None)
    assert resumed.step_count == 3
    resumed.train()
    resumed.close()
    resumed.close()  # safe twice
    assert losses(tmp_path / "part" / "metrics.jsonl") == losses(tmp_path / "whole" / "metrics.jsonl")


class ExplodesWhenPickled:
    def __reduce__(self):
        raise RuntimeError("disk full halfway through the checkpoint")


def test_crash_while_writing_a_checkpoint_keeps_the_previous(tmp_path):
    path = tmp_path / "checkpoint.pt"
    state = {"config": {}, "drafter": {"w": torch.ones(1000)}, "layer_ids": [1], "mask_token_id": 0}
    checkpoint.save(path, {**state, "step": 1})
    with pytest.raises(RuntimeError):
        checkpoint.save(path, {**state, "step": 2, "bad": ExplodesWhenPickled()})
    assert checkpoint.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_qwen3_8b_shapes_on_meta():
    from trainer.config.schema import target_layer_ids
    from trainer.model.target import build_target

    cfg = qwen3_8b()
    target = build_target(cfg.target, meta=True)
    target_params = sum(p.numel() for p in target.parameters())
    assert 7.9e9 < target_params < 8.4e9
    with torch.device("meta"):
        drafter = build_drafter(cfg.drafter, cfg.target, num_taps=5)
    drafter_params = sum(p.numel() for p in drafter.parameters())
    assert 0.9e9 < drafter_params < 1.3e9
    assert target_layer_ids(36, 5) == [1, 9, 17, 25, 33]


def run_trainer_eager(*args, cwd=None) -> subprocess.CompletedProcess:
    """The trainer with compile off for `train` (these tests check behaviour, not graphs), within 5 minutes."""
    args = (*args, "--no-compile") if args[0] == "train" else args
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=cwd or PROJECT,
                          timeout=300)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.e2e
def test_malformed_jsonl_names_file_and_line(tmp_path):
    good = {"input_ids": list(range(1, 40)), "loss_mask": [1] * 39}
    data = write_jsonl(tmp_path / "d.jsonl", [good, "{not json", good, {"input_ids": [1, 2]}] + [good] * 8)
    proc = run_trainer_eager("train", "--out", str(tmp_path / "o"), "--steps", "1", "--data", str(data))
    assert proc.returncode == 1 and f"{data}:2: malformed line" in proc.stderr and "--skip-bad" in proc.stderr
    proc = run_trainer_eager("train", "--out", str(tmp_path / "o"), "--steps", "2", "--data", str(data), "--skip-bad")
    assert proc.returncode == 0, proc.stderr
    assert "dropped 1 too short for one block" in proc.stdout and "1 malformed lines skipped" in proc.stdout


@pytest.mark.e2e
def test_missing_paths_and_too_many_anchors(tmp_path):
    proc = run_trainer_eager("train", "--out", str(tmp_path / "o"), "--target", str(tmp_path / "nope"))
    assert proc.returncode == 1 and "target path" in proc.stderr and "--target" in proc.stderr
    proc = run_trainer_eager("train", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "nope.jsonl"))
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    proc = run_trainer_eager("train", "--out", str(tmp_path / "o"), "--num-anchors", "100000")
    assert proc.returncode == 1 and "num_anchors 100000 exceeds" in proc.stderr


def _save_tokenizer(path: Path, *, with_mask: bool) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<user>", "<assistant>", "<mask>"] + [f"w{i}" for i in range(60)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                   **({"mask_token": "<mask>"} if with_mask else {}))
    fast.chat_template = "{% for m in messages %}<{{ m.role }}> {{ m.content }} {% endfor %}"
    fast.save_pretrained(path)
    return path


@pytest.mark.e2e
def test_tokenizer_without_mask_token(tmp_path):
    tokenizer = _save_tokenizer(tmp_path / "tok", with_mask=False)
    data = write_jsonl(tmp_path / "c.jsonl", [{"conversations": [{"role": "user", "content": "w1 w2"}]}])
    # Every embedding row is a text token: no row is left to serve as MASK.
    config = tmp_path / "full.json"
    config.write_text(json.dumps({"target": {"vocab_size": 64}}))
    proc = run_trainer_eager("train", "--out", str(tmp_path / "o"), "--config", str(config), "--data", str(data),
                       "--tokenizer", str(tokenizer))
    assert proc.returncode == 1 and "no mask token" in proc.stderr and "mask_token_id" in proc.stderr


def test_conversations_train_on_assistant_tokens(tmp_path):
    from transformers import AutoTokenizer

    from trainer.config.schema import DataConfig
    from trainer.data.datasets import load_jsonl

    tokenizer_dir = _save_tokenizer(tmp_path / "tok", with_mask=True)
    reply = " ".join(f"w{i % 60}" for i in range(30))
    rows = [{"conversations": [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": reply}]}]
    data = load_jsonl(str(write_jsonl(tmp_path / "c.jsonl", rows)), DataConfig(buckets=[64]), 4,
                      AutoTokenizer.from_pretrained(tokenizer_dir))
    seq = data.sequences[0]
    assert seq.loss_mask[:4] == [0, 0, 0, 0]  # "<user> w1 w2 w3"
    assert sum(seq.loss_mask) == 31  # "<assistant>" and the 30 reply words


@pytest.mark.e2e
def test_the_demo_run_learns_and_writes_every_metric_to_its_schema(tiny_run):
    """The session's `envkit train --preset tiny` (the demo, compiled): it learned, and every row it wrote is one
    of records.py's schemas, field for field (a field nobody declared fails here)."""
    run_dir, _, _ = tiny_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    evals = [r for r in rows if r.get("eval") and r["method"] == "teacher_forced"]
    [walk] = [r for r in rows if r.get("method") == "walk"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert walk["walk_tau"] >= 1 and {"walk_repeat_tau", "walk_copy_tau", "walk_near_ties"} <= walk.keys()
    assert len(steps) == summary["steps"]
    assert {"step", "loss", "tokens_per_s", "lr", "peak_mem_bytes"} <= steps[0].keys()
    assert {"acceptance_length", "baseline_repeat_tau", "baseline_copy_tau"} <= evals[-1].keys()
    assert evals[-1]["acceptance_length"] > evals[0]["acceptance_length"]
    assert summary["loss_end"] < summary["loss_start"]
    for rows_of, schema in ((steps, records.StepRow), (evals, records.EvalRow), ([walk], records.WalkRow)):
        for row in rows_of:
            assert row.keys() <= schema.__annotations__.keys(), set(row) - set(schema.__annotations__)
    assert {r["method"] for r in rows if r.get("eval")} == {"teacher_forced", "walk"}
    assert all(set(records.EvalRow.__annotations__) == r.keys() for r in evals)
    assert set(records.WalkRow.__annotations__) == walk.keys()
    counters = {k for k in summary if k.startswith(("fxgraph_cache_", "autograd_cache_"))}
    assert summary.keys() - counters == records.Summary.__annotations__.keys(), \
        summary.keys() ^ records.Summary.__annotations__.keys()
    # Evaluated again in another process, eagerly: the same acceptance as the run's last evaluation.
    proc = run_trainer_eager("eval", "--ckpt", str(run_dir / "checkpoint.pt"))
    assert proc.returncode == 0 and json.loads(proc.stdout)["acceptance_length"] == evals[-1]["acceptance_length"]


def test_walk_divergence_is_a_near_tie_only_within_rounding_of_the_dtype():
    from trainer.eval.walk import LosslessError, check_lossless

    logits = torch.zeros(2, 8)
    logits[0, 3], logits[0, 5] = 20.0, 19.8125  # bf16 at 20: 8 ulps = 0.625, so a 0.19 gap is rounding
    logits[1, 3], logits[1, 5] = 1.0, 0.5
    assert check_lossless([3, 3], [3, 3], list(logits), torch.bfloat16)
    assert not check_lossless([5], [3], [logits[0]], torch.bfloat16)  # a near-tie, counted
    with pytest.raises(LosslessError, match="diverged"):
        check_lossless([5], [3], [logits[0]], torch.float32)  # float32 has no such rounding
    with pytest.raises(LosslessError, match="logit gap 0.5"):
        check_lossless([5], [3], [logits[1]], torch.bfloat16)  # small logits: only the 0.1 floor


def test_the_target_stops_at_its_last_tapped_layer_with_the_same_states():
    """Layers past the last tap feed nothing: the view runs fewer layers and gives the full model's states."""
    from trainer.model.target import build_target, tapped_states, up_to_layer

    cfg = tiny()
    cfg.target.num_layers = 6
    model = build_target(cfg.target)
    ids = torch.randint(0, cfg.target.vocab_size, (2, 64))
    positions = torch.cat([torch.arange(40), torch.arange(24)]).repeat(2, 1)  # two packed documents a row
    full = model.model(input_ids=ids, position_ids=positions, output_hidden_states=True, use_cache=False)
    for taps in ([1, 3], [2, 4], [5]):
        expected = torch.cat([full.hidden_states[i + 1] for i in taps], dim=-1)
        assert torch.equal(tapped_states(model, ids, None, taps, position_ids=positions), expected), taps
    assert len(up_to_layer(model, 3).layers) == 4 and len(model.model.layers) == 6  # the full model is intact
    assert up_to_layer(model, 5) is model.model  # the last layer tapped: its reported state is the normed one


def test_a_rule_walked_against_the_greedy_continuation_accepts_what_the_target_verifies():
    """The rules' walk tau comes from the greedy continuation without verification forwards: it must match
    the walk that runs the target, forward by forward."""
    from trainer.model.target import build_target
    from trainer.eval.walk import copy_proposer, greedy_continuation, repeat_proposer, rule_walk, walk

    cfg = tiny()
    target = build_target(cfg.target).eval()
    generator = torch.Generator().manual_seed(3)
    accepted_somewhere = 0
    for _ in range(4):
        prompt = torch.randint(0, cfg.target.vocab_size, (8,), generator=generator).tolist()
        greedy, _logits = greedy_continuation(target, prompt, 40)
        for propose in (repeat_proposer(8), copy_proposer(8)):
            with torch.no_grad():
                walked, per_forward = walk(target, propose, prompt, 40, 8, [1])
            assert walked == greedy
            assert rule_walk(propose, prompt, greedy, 40) == per_forward
            accepted_somewhere += sum(n > 1 for n in per_forward)
    assert accepted_somewhere  # the comparison covered accepted drafts, not only rejections


@pytest.mark.parametrize("packing", [True, False])
def test_precomputed_row_features_are_the_states_a_step_computes(packing):
    """The sequential layout reads the rows' target states computed once (trainer/train/features.py): they must
    be what the step's own target forward gives for the same batch, and used only when they pay."""
    from trainer.train import features
    from trainer.train.setup import build
    from trainer.train.steps import target_states

    cfg = small_config()
    cfg.data.packing = packing
    setup = build(cfg, drafters=["cpu"], targets=["cpu"], log=lambda _m: None)
    assert features.worth_computing(setup)
    setup.cfg.steps = 1
    assert not features.worth_computing(setup)  # a short run never reads every row
    rows = features.compute(setup)
    assert sorted(rows.states) == list(range(len(setup.train_data.rows)))
    for index in range(3):
        batch = setup.train_data.batch(index, 0, 1, cfg.batch_size, cfg.seed)
        with torch.no_grad():
            online = target_states(setup, setup.target, batch)
        torch.testing.assert_close(rows.batch(batch["row_ids"], batch["input_ids"].shape[1]), online, rtol=1e-5, atol=1e-5)
