"""Packing: several documents in one row, each isolated as if it were alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from trainer.config.schema import tiny  # noqa: E402
from trainer.data.datasets import Dataset, Sequence, collate, pack  # noqa: E402
from trainer.model.drafter import SdpaAttention, build_drafter  # noqa: E402
from trainer.model.loss import block_targets, sample_anchors, weighted_block_loss  # noqa: E402
from trainer.model import target_attention  # noqa: E402
from trainer.model.masks import dense_mask  # noqa: E402
from trainer.model.target import build_target, tapped_states  # noqa: E402

from helpers import PROJECT, record_figure, seeded


def documents(lengths, vocab=500, seed=0) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    return [Sequence(torch.randint(vocab, (n,), generator=g).tolist(), [0] * 4 + [1] * (n - 4)) for n in lengths]


def test_first_fit_decreasing_fills_rows_and_keeps_every_document():
    lengths = [100, 30, 90, 40, 60, 10, 70]
    rows = pack(lengths, 128)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 128 for row in rows)
    assert len(rows) == 4  # 400 tokens need at least 4 rows of 128


def llama_target():
    """A small random Llama: its model builds masks without a mask mapping (a BlockMask must reach it as is)."""
    import transformers

    cfg = tiny().target
    config = transformers.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=4,
                                      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                                      intermediate_size=cfg.intermediate_size, head_dim=cfg.head_dim)
    config._attn_implementation = target_attention.install()  # as build_target loads a user's target
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("attention", ["dense block-diagonal (SDPA)", "document BlockMask (compiled flex, as on CUDA)"])
def test_packed_row_gives_each_document_its_own_target_states(attention, family):
    target = build_target(tiny().target) if family == "qwen3" else llama_target()
    docs = documents([40, 150, 130])  # several 128-wide tiles: tiles before, inside and across documents
    batch = collate([docs], 384)
    assert batch["positions"][0, 40].item() == 0 and batch["doc_ids"][0, 380].item() == -1
    doc_ids = batch["doc_ids"] if attention.startswith("document") else None
    packed = tapped_states(target, batch["input_ids"], None, [1, 3], batch["positions"], doc_ids)
    start = 0
    for doc in docs:
        alone = tapped_states(target, torch.tensor([doc.input_ids]), None, [1, 3])
        n = len(doc.input_ids)
        assert torch.allclose(packed[0, start:start + n], alone[0], atol=1e-4), (packed[0, start:start + n] - alone[0]).abs().max()
        start += n


def reference_mask(anchors, doc_ids, context_len, block_size):
    """Built document by document, without the vectorised rule: who may each query see?"""
    batch, blocks = anchors.shape
    q_len = blocks * block_size
    mask = torch.zeros(batch, q_len, context_len + q_len, dtype=torch.bool)
    for b in range(batch):
        for j in range(blocks):
            a = int(anchors[b, j])
            if a < 0:
                continue
            doc = int(doc_ids[b, a])
            start = next(k for k in range(a + 1) if all(int(doc_ids[b, m]) == doc for m in range(k, a + 1)))
            rows = slice(j * block_size, (j + 1) * block_size)
            mask[b, rows, start:a] = True  # its own document's context before the anchor
            mask[b, rows, context_len + j * block_size: context_len + (j + 1) * block_size] = True
    return mask


def test_drafter_mask_never_crosses_documents():
    docs = documents([40, 50, 30])
    batch = collate([docs, documents([120], seed=1)], 128)
    anchors = sample_anchors(batch["loss_mask"], batch["lengths"], 12, 8, torch.Generator().manual_seed(0),
                             batch["doc_ids"])
    for b in range(2):
        for a in anchors[b][anchors[b] >= 0].tolist():  # every block lies inside the anchor's document
            assert batch["doc_ids"][b, a] == batch["doc_ids"][b, a + 7] >= 0
    assert torch.equal(dense_mask(anchors, 128, 8, batch["doc_ids"]), reference_mask(anchors, batch["doc_ids"], 128, 8))


def test_flex_mask_mod_agrees_with_the_dense_mask_on_packed_rows():
    from torch.nn.attention.flex_attention import create_mask

    from trainer.model.masks import make_mask_mod

    batch = collate([documents([40, 50, 30]), documents([60, 60], seed=2)], 128)
    anchors = sample_anchors(batch["loss_mask"], batch["lengths"], 10, 8, torch.Generator().manual_seed(3),
                             batch["doc_ids"])
    flex = create_mask(make_mask_mod(anchors, 128, 8, batch["doc_ids"]), 2, 1, 80, 128 + 80)
    assert torch.equal(flex[:, 0], dense_mask(anchors, 128, 8, batch["doc_ids"]))


def row_of(lengths: list[int], length: int) -> torch.Tensor:
    ids = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])
    return torch.cat([ids, torch.full((length - len(ids),), -1)])[None]


@pytest.mark.parametrize("lengths,block_size,num_anchors", [
    ([100, 60, 96], 16, 16), ([384], 16, 24), ([10, 200, 30, 16], 8, 32), ([300, 40], 16, 8)])
def test_drafter_tiles_from_anchors_equal_create_block_mask(lengths, block_size, num_anchors):
    """The BlockMask built from the anchors' ranges skips exactly the tiles create_block_mask does, and
    flex_attention gives the same output through either."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from trainer.model.masks import flex_block_mask, make_mask_mod

    length = 128 * ((sum(lengths) + 127) // 128)
    doc_ids = row_of(lengths, length)
    anchors = sample_anchors(torch.ones(1, length, dtype=torch.bool), torch.tensor([sum(lengths)]), num_anchors,
                             block_size, torch.Generator().manual_seed(1), doc_ids)
    q_len = num_anchors * block_size
    fast = flex_block_mask(anchors, length, block_size, doc_ids)
    reference = create_block_mask(make_mask_mod(anchors, length, block_size, doc_ids), 1, None, q_len,
                                  length + q_len, device="cpu")
    assert torch.equal(fast.to_dense(), reference.to_dense())
    q, k = torch.randn(1, 4, q_len, 32), torch.randn(1, 2, length + q_len, 32)
    v = torch.randn_like(k)
    assert torch.equal(flex_attention(q, k, v, block_mask=fast, enable_gqa=True),
                       flex_attention(q, k, v, block_mask=reference, enable_gqa=True))


def test_target_document_tiles_equal_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    from trainer.model.target_attention import document_mask

    doc_ids = torch.cat([row_of([100, 200, 300], 768), row_of([128, 128, 256, 5], 768)])
    reference = create_block_mask(
        lambda b, h, q, kv: (doc_ids[b, q] == doc_ids[b, kv]) & (kv <= q), 2, None, 768, 768, device="cpu")
    fast = document_mask(doc_ids)
    assert torch.equal(fast.to_dense(), reference.to_dense())
    assert fast.sparsity() > 50  # the point of it: most of the causal triangle is between documents


def test_packed_loss_is_the_token_weighted_loss_of_the_documents_alone():
    cfg = tiny()
    torch.manual_seed(0)
    target = build_target(cfg.target)
    drafter = build_drafter(cfg.drafter, cfg.target, num_taps=1)
    head = target.get_output_embeddings().weight
    embed = target.get_input_embeddings().weight
    docs = documents([40, 50, 30], seed=3)
    batch = collate([docs], 128)
    anchors = sample_anchors(batch["loss_mask"], batch["lengths"], 12, 8, torch.Generator().manual_seed(1),
                             batch["doc_ids"])

    def loss_sum(batch, anchors, positions=None, doc_ids=None, packed=False):
        tapped = tapped_states(target, batch["input_ids"], None if packed else batch["attention_mask"], [2],
                               positions)
        block_ids, labels, weights = block_targets(batch["input_ids"], batch["loss_mask"], batch["lengths"], anchors,
                                                   8, cfg.drafter.gamma, 511)
        prepared = SdpaAttention.prepare(anchors, tapped.shape[1], 8, doc_ids)
        with torch.no_grad():
            hidden = drafter(tapped, torch.nn.functional.embedding(block_ids, embed), anchors, SdpaAttention,
                             prepared, positions)
            loss = weighted_block_loss(hidden, head, labels, weights, 2048)
        return float(loss) * float(weights.sum()), float(weights.sum())

    packed_sum, packed_weight = loss_sum(batch, anchors, batch["positions"], batch["doc_ids"], packed=True)
    total, weight, start = 0.0, 0.0, 0
    for d, doc in enumerate(docs):
        n = len(doc.input_ids)
        mine = anchors[0][(anchors[0] >= start) & (anchors[0] < start + n)] - start
        if len(mine):
            alone = collate([[doc]], n)
            s, w = loss_sum(alone, mine[None])
            total, weight = total + s, weight + w
        start += n
    assert weight == pytest.approx(packed_weight)
    assert packed_sum / packed_weight == pytest.approx(total / weight, rel=1e-4)


@pytest.mark.e2e
def test_no_packing_keeps_one_sequence_a_row_and_metrics_report_padding(tmp_path):
    docs = documents([40, 50, 30, 100])
    assert [len(r) for r in Dataset(docs, [64, 128]).rows] == [1, 1, 1, 1]
    assert len(Dataset(docs, [64, 128], packing=True).rows) == 2
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"preset": "tiny", "data": {"num_sequences": 32, "eval_sequences": 4},
                                  "walk_prompts": 1, "walk_new_tokens": 8, "eval_every": 0}))
    for flag, expect_packed in (("--no-packing", False), (None, True)):
        out = tmp_path / str(flag)
        args = ["--config", str(config), "--steps", "3", "--no-compile", "--out", str(out)]
        if flag:
            args.append(flag)
        proc = subprocess.run([sys.executable, "-m", "trainer", "train", *args], capture_output=True, text=True,
                              cwd=PROJECT, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "loss" in r]
        assert all({"tokens_per_s", "useful_tokens_per_s", "pad_fraction"} <= r.keys() for r in steps)
        assert all(r["useful_tokens_per_s"] <= r["tokens_per_s"] for r in steps)
        assert ("packed" in proc.stdout) == expect_packed


@pytest.mark.e2e
def test_packing_removes_padding_and_learns_as_well(tmp_path):
    """What packing buys is certain: the same rows with a fraction of the padding (0.10 against 0.26 of all 600
    steps' positions). What it must not cost is learning: teacher-forced tau within 10% of the unpacked run's
    (0.97-1.08 of it over seeds 0-5). Neither run is asked to beat the other: after the same 600 steps that was a
    coin toss, and on the random target's 16 walk prompts the two swing by 20% either way."""
    # Two buckets, where packing fills a 128-token row with the 64-128-token documents' shorter ones (tiny's
    # own single bucket leaves nearly nothing to pack).
    config = tmp_path / "c.json"
    # The walk is not asserted here: one short prompt keeps its end-of-run cost out of the two runs.
    config.write_text(json.dumps(seeded({"preset": "tiny", "data": {"buckets": [64, 128]}, "walk_prompts": 1,
                                         "walk_new_tokens": 8})))
    summaries = {}
    for flag in ("--no-packing", "--packing"):
        out = tmp_path / flag
        proc = subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(config), "--steps", "600",
                               "--no-compile", flag, "--out", str(out)], capture_output=True, text=True, cwd=PROJECT,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summaries[flag] = json.loads((out / "summary.json").read_text())
    packed, unpacked = summaries["--packing"], summaries["--no-packing"]
    record_figure("packing: tau packed vs unpacked", packed=packed["tau_end"], unpacked=unpacked["tau_end"],
                  copy=packed["baseline_copy_tau"], pad_packed=packed["pad_fraction"],
                  pad_unpacked=unpacked["pad_fraction"])
    assert packed["pad_fraction"] <= 0.5 * unpacked["pad_fraction"], (packed, unpacked)
    assert packed["tau_end"] >= 0.9 * unpacked["tau_end"], (packed, unpacked)
    assert packed["tau_end"] > 1.5 * packed["baseline_copy_tau"], packed  # and both learned: 2.24 vs the rule's 1.14
