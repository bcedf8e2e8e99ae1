"""A run's data from a token store (trainer/data/store.py): the documents, the held-out split, the packing plan.

A document is a stretch of a store row: the row truncated to the largest bucket (JSONL), or cut into
pieces of that length (plain text). Rows whose content hash falls below `data.heldout_fraction` are
held out (never trained on; the first `eval_sequences` of them are evaluated and walked). The
document table and the packing plan depend on the store and a few config fields only, so they are
computed once per store and config and kept beside it (`plans/DIGEST/*.npy`, written atomically under
the store's lock); every rank memory-maps them, so its memory does not grow with the data.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from trainer.common.errors import TrainerInputError
from trainer.common.files import atomic_write, open_lock_file, permission_problem, read_json_record
from trainer.config.schema import TrainConfig
from trainer.data.datasets import Dataset, Plan
from trainer.data.rows import Sequence
from trainer.data.store_reader import TokenStore

PLAN_VERSION = 1
PLAN_ARRAYS = ("doc_row", "doc_start", "doc_len", "eval_docs", "row_offsets", "row_docs", "row_bucket")


class StoreDocuments:
    """Documents as (store row, start, length), read from the memory-mapped store on demand."""

    def __init__(self, store: TokenStore, doc_row: np.ndarray, doc_start: np.ndarray, doc_len: np.ndarray):
        self.store, self.doc_row, self.doc_start, self.lengths = store, doc_row, doc_start, doc_len

    def __len__(self) -> int:
        return len(self.lengths)

    def get(self, index: int) -> Sequence:
        return self.store.row(int(self.doc_row[index]), int(self.doc_start[index]), int(self.lengths[index]))


def _plan_spec(store: TokenStore, cfg: TrainConfig, block_size: int) -> dict:
    return {"version": PLAN_VERSION, "store": store.path.name, "buckets": cfg.data.buckets, "block_size": block_size,
            "heldout_fraction": cfg.data.heldout_fraction, "packing": cfg.data.packing}


def _documents(store: TokenStore, cfg: TrainConfig, block_size: int) -> dict:
    """The document table: every trainable stretch of a row, and which documents are held out."""
    limit = cfg.data.buckets[-1]
    lengths = np.diff(np.asarray(store.offsets))
    rows = np.arange(store.rows, dtype=np.int64)
    if store.manifest["kind"] == "text":  # cut, not truncated: a text file is one long document
        pieces = np.maximum(1, -(-lengths // limit))
        doc_row = np.repeat(rows, pieces)
        first_piece = np.repeat(np.cumsum(pieces) - pieces, pieces)
        doc_start = (np.arange(len(doc_row)) - first_piece) * limit
        doc_len = np.minimum(limit, lengths[doc_row] - doc_start)
        trainable = doc_len >= block_size + 1
        truncated = 0
    else:
        doc_row, doc_start = rows, np.zeros(store.rows, dtype=np.int64)
        doc_len = np.minimum(lengths, limit)
        first = np.asarray(store.first_supervised)
        trainable = (doc_len >= block_size + 1) & (first >= 1) & (first < doc_len)
        truncated = int((lengths > limit).sum())
    row_hash = np.asarray(store.row_hash)
    heldout_rows = row_hash < np.uint64(int(cfg.data.heldout_fraction * 2 ** 64))
    if not heldout_rows.any():  # too few rows for the fraction: the row of smallest hash
        heldout_rows[int(np.argmin(row_hash))] = True
    heldout = heldout_rows[doc_row]
    if not (trainable & heldout).any() and trainable.any():  # none evaluable: the trainable doc of smallest hash
        candidates = np.flatnonzero(trainable)
        heldout = np.zeros_like(heldout)
        heldout[candidates[int(np.argmin(row_hash[doc_row[candidates]]))]] = True
    train = trainable & ~heldout
    return {"doc_row": doc_row[train], "doc_start": doc_start[train], "doc_len": doc_len[train],
            "eval_docs": np.stack([doc_row, doc_start, doc_len])[:, trainable & heldout],
            "counts": {"train_docs": int(train.sum()), "eval_docs": int((trainable & heldout).sum()),
                       "dropped_short": int((~trainable).sum()), "truncated": truncated,
                       "heldout_rows": int(heldout_rows.sum())}}


def _build_plan(store: TokenStore, cfg: TrainConfig, block_size: int, out: Path, spec: dict) -> None:
    table = _documents(store, cfg, block_size)
    if not table["counts"]["train_docs"]:
        raise TrainerInputError(f"no training row of {store.manifest['source']['name']} is long enough for one block "
                                f"of {block_size} tokens with a supervised token ({table['counts']['dropped_short']} "
                                f"dropped); give longer data or a smaller block size")
    plan = Plan.make(table["doc_len"], cfg.data.buckets, cfg.data.packing)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        arrays = {**{k: table[k] for k in ("doc_row", "doc_start", "doc_len", "eval_docs")},
                  "row_offsets": plan.row_offsets, "row_docs": plan.row_docs, "row_bucket": plan.row_bucket}
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(array, dtype=np.int64))
        atomic_write(tmp / "plan.json", json.dumps({**spec, "counts": table["counts"]}, indent=2) + "\n")  # last
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_plan(store: TokenStore, cfg: TrainConfig, block_size: int) -> tuple[dict, dict]:
    """({name: memory-mapped array}, counts) of the store's plan for this config; computed once, under a lock."""
    spec = _plan_spec(store, cfg, block_size)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    plans = store.path / "plans"
    out = plans / digest
    if not (out / "plan.json").exists():
        plans.mkdir(exist_ok=True)
        lock = open_lock_file(plans / f".{digest}.lock")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / "plan.json").exists():
                for stale in plans.glob(f".{digest}.tmp-*"):
                    shutil.rmtree(stale, ignore_errors=True)
                _build_plan(store, cfg, block_size, out, spec)
        finally:
            os.close(lock)
    record = read_json_record(out / "plan.json")
    problems = [problem for entry in (out, *(out / f"{n}.npy" for n in PLAN_ARRAYS))
                if (problem := permission_problem(entry) if os.path.lexists(entry) else "missing")]
    if not record or record.get("version") != PLAN_VERSION or problems:
        raise TrainerInputError(f"the packing plan {str(out)!r} is damaged or not yours ({problems[:1] or 'plan.json'});"
                                f" remove it (`rm -r {out}`) and it is computed again")
    try:
        arrays = {name: np.load(out / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in PLAN_ARRAYS}
    except (ValueError, OSError) as exc:
        raise TrainerInputError(f"the packing plan {str(out)!r} is unreadable ({exc}); remove it (`rm -r {out}`) "
                                f"and it is computed again") from None
    return arrays, record["counts"]


def store_datasets(store: TokenStore, cfg: TrainConfig, block_size: int, skipped_bad: int) -> tuple[Dataset, Dataset]:
    """(training data read from the store through its plan, the held-out rows in memory for evaluation)."""
    arrays, counts = load_plan(store, cfg, block_size)
    documents = StoreDocuments(store, arrays["doc_row"], arrays["doc_start"], arrays["doc_len"])
    plan = Plan(arrays["row_offsets"], arrays["row_docs"], arrays["row_bucket"])
    train = Dataset(None, cfg.data.buckets, dropped_short=counts["dropped_short"], truncated=counts["truncated"],
                    skipped_bad=skipped_bad, packing=cfg.data.packing, documents=documents, plan=plan)
    eval_docs = arrays["eval_docs"]
    if not eval_docs.shape[1]:
        raise TrainerInputError(f"none of the {counts['heldout_rows']} held-out rows of "
                                f"{store.manifest['source']['name']} can be evaluated (too short); raise "
                                f"data.heldout_fraction or give longer data")
    held = [store.row(int(r), int(s), int(n)) for r, s, n in eval_docs[:, :cfg.data.eval_sequences].T]
    held = [Sequence(seq.input_ids.tolist(), np.asarray(seq.loss_mask).tolist()) for seq in held]
    return train, Dataset(held, cfg.data.buckets)
