"""Data at scale: a data file prepared once into a token store, read in epochs by every rank and replica.

The store is checked as a user would meet it: a real file through `python -m trainer prepare` (worker
processes), a store edited on disk, a prepare killed by SIGKILL, rows appended to a file, and
`envkit train -- --data FILE --epochs 2` twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PROJECT, one_line_error, run_envkit, run_trainer

np = pytest.importorskip("numpy")
pytest.importorskip("torch")

from trainer.common.errors import TrainerInputError  # noqa: E402
from trainer.config.schema import tiny  # noqa: E402
from trainer.data import datasets, decode_cache, store, store_reader  # noqa: E402
from trainer.data.datasets import Dataset  # noqa: E402
from trainer.data.rows import Sequence  # noqa: E402
from trainer.data.storedata import store_datasets  # noqa: E402
from trainer.model.target import build_target  # noqa: E402


def write_rows(path: Path, count: int, seed: int = 0, mode: str = "w") -> Path:
    rng = random.Random(seed)
    with path.open(mode) as handle:
        for _ in range(count):
            length = rng.randint(12, 300)
            handle.write(json.dumps({"input_ids": [rng.randrange(1, 500) for _ in range(length)],
                                     "loss_mask": [0] * 4 + [1] * (length - 4)}) + "\n")
    return path


def prepare_cli(*args: str, env=None, timeout: float = 300, python_flags=()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, "-m", "trainer", "prepare", "--preset", "tiny", "--json",
                           *args],
                          capture_output=True, text=True, cwd=PROJECT, env=env, timeout=timeout)


# -- epochs ---------------------------------------------------------------------------------------------------
def small_dataset(docs: int = 203, packing: bool = True) -> Dataset:
    rng = random.Random(1)
    sequences = []
    for _ in range(docs):
        length = rng.randint(10, 128)
        sequences.append(Sequence([1] * length, [1] * length))
    return Dataset(sequences, [64, 128], packing=packing)


@pytest.mark.parametrize("packing", [True, False])
def test_every_row_once_per_epoch_over_two_ranks_and_two_replicas(packing):
    data = small_dataset(packing=packing)
    ranks, replicas, batch = 2, 2, 4
    slots = ranks * replicas
    per_epoch = data.steps_per_epoch(slots, batch)
    for epoch in range(2):
        seen = []
        for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            for rank in range(ranks):
                for replica in range(replicas):
                    bucket, rows = data.batch_rows(step, rank * replicas + replica, slots, batch, seed=3)
                    rows = [int(r) for r in rows if r >= 0]
                    assert all(data.plan.row_bucket[r] == bucket for r in rows)  # one shape a batch
                    seen += rows
        assert sorted(seen) == list(range(data.num_rows)), f"epoch {epoch}"
    first = [data.batch_rows(s, 0, slots, batch, 3)[1].tolist() for s in range(per_epoch)]
    second = [data.batch_rows(s, 0, slots, batch, 3)[1].tolist() for s in range(per_epoch, 2 * per_epoch)]
    assert first != second  # each epoch its own order


def test_a_resume_mid_epoch_yields_the_same_next_batches():
    data = small_dataset()
    per_epoch = data.steps_per_epoch(2, 4)
    mid = per_epoch + per_epoch // 2
    before = [data.batch(s, slot, 2, 4, 7)["input_ids"] for s in range(mid, mid + 5) for slot in range(2)]
    resumed = small_dataset()  # a new process: nothing carried over but the step
    after = [resumed.batch(s, slot, 2, 4, 7)["input_ids"] for s in range(mid, mid + 5) for slot in range(2)]
    assert all(bool((a == b).all()) for a, b in zip(before, after))


# -- the store --------------------------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ENVKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_prepare_once_reuse_after_and_read_back_exactly(tmp_path, home):
    rows = write_rows(tmp_path / "rows.jsonl", 500)
    first = json.loads(prepare_cli("--data", str(rows)).stdout)
    again = json.loads(prepare_cli("--data", str(rows), "--verify").stdout)
    assert not first["reused"] and again["reused"] and again["store"] == first["store"] and again["verified"]
    opened = store_reader.open_store(Path(first["store"]))
    lines = rows.read_text().splitlines()
    for index in (0, 123, 499):
        expected = json.loads(lines[index])
        seq = opened.row(index)
        assert seq.input_ids.tolist() == expected["input_ids"] and seq.loss_mask.tolist() == expected["loss_mask"]
    assert opened.tokens.dtype == np.uint16  # the tiny target's 512-token vocabulary fits in two bytes


def test_preparing_token_ids_never_imports_torch(tmp_path, home):
    """A store of token-id rows needs numpy, not torch (2 s of a process's start)."""
    rows = write_rows(tmp_path / "rows.jsonl", 10)
    proc = prepare_cli("--data", str(rows), python_flags=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "numpy" in imported and "torch" not in imported


def test_a_changed_source_or_tokenizer_is_a_new_store(tmp_path, home):
    rows = write_rows(tmp_path / "rows.jsonl", 50)
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    source = store._source(rows)
    key = store.store_key(source, store._tokenizer_files(str(tokenizer)), None, 512)
    (tokenizer / "tokenizer.json").write_text('{"changed": 1}')
    assert store.store_key(source, store._tokenizer_files(str(tokenizer)), None, 512) != key
    assert store.store_key(source, store._tokenizer_files(str(tokenizer)), {"enable_thinking": False}, 512) != key
    first = json.loads(prepare_cli("--data", str(rows)).stdout)
    data = rows.read_bytes()  # one byte changed, same size: the first row's first loss-mask entry
    rows.write_bytes(data.replace(b'"loss_mask": [0', b'"loss_mask": [1', 1))
    second = json.loads(prepare_cli("--data", str(rows)).stdout)
    assert second["store"] != first["store"] and not second["reused"]


def test_the_held_out_rows_stay_put_when_rows_are_appended(tmp_path, home):
    rows = write_rows(tmp_path / "rows.jsonl", 400, seed=1)
    cfg = tiny()
    cfg.data.heldout_fraction = 0.05

    def split(path: Path) -> tuple[set, set]:
        prepared = store.prepare(path, vocab_size=512, log=lambda m: None)
        opened = store_reader.open_store(Path(prepared.store))
        train, held = store_datasets(opened, cfg, cfg.drafter.block_size, 0)
        as_key = lambda seq: tuple(np.asarray(seq.input_ids).tolist())  # noqa: E731
        trained = {as_key(train.documents.get(i)) for i in range(len(train.documents))}
        return trained, {as_key(held.documents.get(i)) for i in range(len(held.documents))}

    cfg.data.eval_sequences = 10_000
    trained, held = split(rows)
    assert held and not trained & held
    write_rows(rows, 400, seed=2, mode="a")
    trained_more, held_more = split(rows)
    assert held <= held_more and not held & trained_more  # nothing held out before is trained on now


@pytest.mark.e2e
def test_a_tampered_store_file_is_a_one_line_error_naming_it(tmp_path, home):
    rows = write_rows(tmp_path / "rows.jsonl", 100)
    prepared = json.loads(prepare_cli("--data", str(rows)).stdout)
    tokens = Path(prepared["store"]) / "tokens.bin"
    original = tokens.read_bytes()
    tokens.write_bytes(original[:-2] + b"\x00\x01")  # same size: only a re-hash sees it
    assert prepare_cli("--data", str(rows)).returncode == 0
    assert "tokens.bin" in one_line_error(prepare_cli("--data", str(rows), "--verify"))
    tokens.write_bytes(original[:-2])  # truncated: seen on every load
    error = one_line_error(subprocess.run([sys.executable, "-m", "trainer", "train", "--preset", "tiny", "--data",
                                           str(rows), "--steps", "1", "--out", str(tmp_path / "o")],
                                          capture_output=True, text=True, cwd=PROJECT, timeout=300))
    assert "tokens.bin" in error and "rm -r" in error


def test_a_bad_line_in_a_later_chunk_names_its_file_and_line(tmp_path, home, monkeypatch):
    rows = write_rows(tmp_path / "rows.jsonl", 600)
    with rows.open("a") as handle:
        handle.write('{"input_ids": [1, 2, 700]}\n')  # outside the 512-token vocabulary
    monkeypatch.setattr(store, "CHUNK_BYTES", 64 << 10)  # many chunks, several workers
    with pytest.raises(TrainerInputError, match=rf"{rows}:601: malformed line \(token id 700"):
        store.prepare(rows, vocab_size=512, workers=2, log=lambda m: None)
    skipped = store.prepare(rows, vocab_size=512, workers=2, skip_bad=True, log=lambda m: None)
    assert skipped.rows == 600 and skipped.skipped == 1


@pytest.mark.e2e
def test_a_killed_prepare_leaves_no_store_a_later_run_takes_as_built(tmp_path, home):
    rows = write_rows(tmp_path / "big.jsonl", 30_000, seed=5)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "prepare", "--preset", "tiny", "--data", str(rows)],
                            cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    data_root = home / "data"
    deadline = time.monotonic() + 120
    while not list(data_root.glob(".*.tmp-*/tokens.bin")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not [p for p in data_root.iterdir() if not p.name.startswith(".")]  # nothing that looks built
    done = json.loads(prepare_cli("--data", str(rows)).stdout)
    assert not done["reused"] and done["rows"] == 30_000
    assert not list(data_root.glob(".*.tmp-*"))  # the killed one's litter is gone


@pytest.mark.e2e
def test_envkit_train_prepares_once_and_trains_two_epochs(tmp_path, cpu_venv, warm_cache_root):
    import shutil

    rows = write_rows(tmp_path / "rows.jsonl", 300, seed=9)
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache_root, cache, symlinks=True)
    env = dict(os.environ, ENVKIT_CACHE_DIR=str(cache))
    config = tmp_path / "short-walk.json"  # the tiny preset's shapes (the cache key) with a short walk
    config.write_text(json.dumps({"preset": "tiny", "walk_prompts": 2, "walk_new_tokens": 16, "eval_every": 0}))
    runs = []
    for name in ("first", "second"):
        proc = run_envkit("train", "--venv", str(cpu_venv), "--config", str(config), "--name", name, "--", "--data",
                          str(rows), "--epochs", "2", env=env, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs.append(Path(os.environ["ENVKIT_RUNS_DIR"]) / name)
    first_log, second_log = ((run / "train.log").read_text() for run in runs)
    # Prepared once (by the first run's warm-up or its training), reused by the second run.
    assert "data: token store" in first_log and "(reused)" in second_log and "prepared in" not in second_log
    assert len([p for p in (Path(os.environ["ENVKIT_HOME"]) / "data").iterdir() if not p.name.startswith(".")]) == 1
    summary = json.loads((runs[0] / "summary.json").read_text())
    steps = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line and '"eval"' not in line]
    assert {row["epoch"] for row in steps} == {0, 1} and summary["epochs"] == 2.0
    per_epoch = summary["steps"] // 2
    assert steps[-1]["rows_seen"] == 2 * sum(row["rows"] for row in steps if row["step"] <= per_epoch)


def test_plain_text_and_conversations_through_the_store(tmp_path, home):
    from trainer.data import corpus
    from trainer.targets import maketarget

    files = [f for f in corpus.files() if not f.held_out][:8]
    tokenizer = maketarget.train_tokenizer([corpus.read(f) for f in files], 300)
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}")
    tokenizer_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tokenizer_dir)
    text = "".join(corpus.read(f) for f in files[:3])
    (tmp_path / "code.txt").write_text(text)
    prepared = store.prepare(tmp_path / "code.txt", tokenizer_dir=str(tokenizer_dir), vocab_size=len(tokenizer),
                             log=lambda m: None)
    opened = store_reader.open_store(Path(prepared.store))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert np.asarray(opened.tokens).tolist() == ids and opened.manifest["kind"] == "text"
    cfg = tiny()
    cfg.data.buckets = [64, 128]
    train, held = store_datasets(opened, cfg, cfg.drafter.block_size, 0)
    assert max(train.documents.lengths) <= 128  # cut into pieces of the largest bucket, not truncated
    assert sum(train.documents.lengths) + sum(len(s.input_ids) for s in held.documents.sequences) <= len(ids)

    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"conversations": [{"role": "user", "content": "def f(x):"},
                                                   {"role": "assistant", "content": "    return x + 1"}]}) + "\n")
    prepared = store.prepare(chats, tokenizer_dir=str(tokenizer_dir), vocab_size=len(tokenizer), log=lambda m: None)
    row = store_reader.open_store(Path(prepared.store)).row(0)
    assert 0 < int(row.loss_mask.sum()) < len(row.loss_mask)  # the assistant's tokens only


def test_a_source_digest_is_remembered_only_while_the_file_is_unchanged(tmp_path, home):
    """Start-up does not re-hash an unchanged data file, and nothing fools it into skipping a changed one."""
    from trainer.data.source_digest import source_sha256
    from trainer.common.files import file_sha256

    data, memo = tmp_path / "rows.jsonl", tmp_path / "memo"
    data.write_text('{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n')
    first = source_sha256(data, memo)
    [record] = list(memo.iterdir())
    assert first == file_sha256(data) and oct(record.stat().st_mode & 0o777) == "0o600"
    # A memo that claims another digest is used while the file is unchanged (it is envkit's own, private)...
    forged = json.loads(record.read_text()) | {"sha256": "f" * 64}
    record.write_text(json.dumps(forged))
    assert source_sha256(data, memo) == "f" * 64
    # ...but not once others could have written it,
    record.chmod(0o666)
    assert source_sha256(data, memo) == first
    # and an edit that restores the size and mtime changes ctime: re-hashed.
    before = data.stat()
    data.write_text('{"input_ids": [1, 2, 4], "loss_mask": [0, 1, 1]}\n')
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert source_sha256(data, memo) == file_sha256(data) != first


@pytest.mark.e2e
def test_token_ids_are_checked_at_load_and_skip_bad_skips_them(tmp_path):
    data = tmp_path / "d.jsonl"
    good = {"input_ids": list(range(1, 40)), "loss_mask": [1] * 39}
    lines = [json.dumps(good)] * 30 + [json.dumps({"input_ids": [1, 2, 512, 3] * 10}),
                                       json.dumps({"input_ids": [-1] * 40})]
    data.write_bytes(("\n".join(lines) + "\n").encode() + b'{"input_ids": [1, 2, "\xff"]}\n')
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"preset": "tiny", "steps": 2, "compile": False, "eval_every": 0, "walk_prompts": 1,
                                  "walk_new_tokens": 8, "data": {"buckets": [64]}}))
    proc = run_trainer("train", "--config", str(config), "--data", str(data), "--out", str(tmp_path / "o"))
    assert f"{data}:31: malformed line (token id 512 is outside the vocabulary (0..511))" in one_line_error(proc)
    proc = run_trainer("train", "--config", str(config), "--data", str(data), "--out", str(tmp_path / "o2"),
                       "--skip-bad")
    assert proc.returncode == 0, proc.stderr[-2000:]
    non_utf8 = tmp_path / "bad.jsonl"
    non_utf8.write_bytes(b'{"input_ids": [1, 2]}\n{"input_ids": "\xff\xfe"}\n')
    assert f"{non_utf8}:2: malformed line" in one_line_error(run_trainer("train", "--config", str(config), "--data",
                                                                          str(non_utf8), "--out", str(tmp_path / "o3")))


@pytest.mark.parametrize("greedy", [False, True])
def test_generated_data_decodes_through_a_cache_growing_in_place_to_the_same_tokens(monkeypatch, greedy):
    """Generation writes each step's keys and values in place (trainer/data/decode_cache.py) where
    transformers' DynamicCache copies the whole cache: the tokens must be those DynamicCache decodes,
    sampled and greedy, across the buffer's growth (8 prompt tokens, 120 decoded)."""
    cfg = tiny()
    cfg.data.greedy = greedy
    target = build_target(cfg.target)
    caches, growing = [], decode_cache.growing_cache
    monkeypatch.setattr(decode_cache, "growing_cache", lambda: caches.append(growing()) or caches[-1])
    grown = datasets.generate(target, cfg.data, 6, 1, 3, cfg.drafter.block_size)
    layers = caches[0].layers
    assert len(layers) == cfg.target.num_layers and all(type(layer) is decode_cache.GrowingLayer for layer in layers)
    assert layers[0].filled == 127 and layers[0].key_buffer.shape[-2] > 2 * 8  # 8 prompt tokens + 119 fed; it grew
    monkeypatch.setattr(decode_cache, "growing_cache", decode_cache.DynamicCache)
    copied = datasets.generate(target, cfg.data, 6, 1, 3, cfg.drafter.block_size)
    assert [s.input_ids for s in grown.sequences] == [s.input_ids for s in copied.sequences]
    assert len({len(s.input_ids) for s in grown.sequences}) > 1


# -- a store vouches only for the bytes it holds ----------------------------------------------------------------
def test_a_file_replaced_while_prepare_hashes_it_is_refused_not_keyed_by_the_old_bytes(tmp_path, home, monkeypatch):
    """The attack: the file is renamed over while its sha256 is computed. The digest (of the old file) must not key
    a store holding the new file's rows."""
    from trainer.data import source_digest

    rows, swapped = write_rows(tmp_path / "rows.jsonl", 50, seed=1), write_rows(tmp_path / "other.jsonl", 80, seed=2)
    original = rows.read_bytes()
    hash_then_swap = source_digest.file_sha256

    def attacker(path):
        digest = hash_then_swap(path)
        os.rename(swapped, path)  # after the bytes were read, before any worker reads them
        return digest

    monkeypatch.setattr(source_digest, "file_sha256", attacker)
    with pytest.raises(TrainerInputError, match="changed while it was read"):
        store.prepare(rows, vocab_size=512, workers=1)
    monkeypatch.setattr(source_digest, "file_sha256", hash_then_swap)  # not undo(): that would unset ENVKIT_HOME too
    rows.write_bytes(original)
    again = store.prepare(rows, vocab_size=512, workers=1)
    assert not again.reused and again.rows == 50


def test_verify_catches_a_store_whose_rows_are_not_of_its_source(tmp_path, home):
    """A store built by an earlier envkit under that attack (B's rows where A's key is) passes a re-hash of its own
    files; `--verify` reads the source again and refuses it."""
    a, b = write_rows(tmp_path / "a.jsonl", 40, seed=3), write_rows(tmp_path / "b.jsonl", 40, seed=4)
    store_a = Path(json.loads(prepare_cli("--data", str(a)).stdout)["store"])
    store_b = Path(json.loads(prepare_cli("--data", str(b)).stdout)["store"])
    for entry in store_a.iterdir():
        entry.unlink()
    store_a.rmdir()
    store_b.rename(store_a)
    assert json.loads(prepare_cli("--data", str(a)).stdout)["reused"]  # sizes match: only --verify can tell
    error = one_line_error(prepare_cli("--data", str(a), "--verify"))
    assert "other bytes than" in error and str(a) in error


@pytest.mark.parametrize("dtype", ["float64", "object", "int16", "float16"])
def test_a_manifest_naming_another_token_dtype_is_one_line(tmp_path, home, dtype):
    rows = write_rows(tmp_path / "rows.jsonl", 30)
    prepared = Path(json.loads(prepare_cli("--data", str(rows)).stdout)["store"])
    manifest = json.loads((prepared / "manifest.json").read_text())
    (prepared / "manifest.json").write_text(json.dumps(manifest | {"token_dtype": dtype}))
    error = one_line_error(prepare_cli("--data", str(rows)))
    assert "token_dtype" in error and dtype in error and "rm -r" in error


def test_one_enormous_line_is_cut_into_bounded_chunks_or_refused(tmp_path, home, monkeypatch):
    """Memory is bounded whatever the file: plain text with no newline is cut between characters, a JSONL row over
    the limit is one line naming the file."""
    monkeypatch.setattr(store, "CHUNK_BYTES", 64 << 10)
    text = tmp_path / "one-line.txt"
    text.write_bytes(("naïve€" * 60_000).encode())  # 540 kB, no newline, multi-byte characters
    data = text.read_bytes()
    chunks = store._chunks(text, len(data), True)
    assert len(chunks) >= 4 and max(end - start for start, end in chunks) <= 2 * store.CHUNK_BYTES
    assert b"".join(data[start:end] for start, end in chunks) == data
    assert all(data[start:end].decode("utf-8") for start, end in chunks)  # no character split
    monkeypatch.setattr(store, "LINE_LIMIT", 128 << 10)
    jsonl = tmp_path / "one-line.jsonl"
    jsonl.write_text(json.dumps({"input_ids": list(range(1, 500)) * 200, "loss_mask": [1] * 99_800}) + "\n")
    with pytest.raises(TrainerInputError, match="longer than"):
        store.prepare(jsonl, vocab_size=512, workers=1)


def test_prepare_names_the_vocabulary_it_checks_against(tmp_path, home):
    """Ids of a real tokenizer checked against the default preset's 512 tokens: the error names that vocabulary
    and how to choose the right one, and does not offer --skip-bad for a file that is not at fault."""
    rows = tmp_path / "qwen_rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [151643, 49482, 11], "loss_mask": [0, 1, 1]}) + "\n")
    error = one_line_error(subprocess.run([sys.executable, "-m", "trainer", "prepare", "--data", str(rows)],
                                          capture_output=True, text=True, cwd=PROJECT, timeout=120))
    assert "tiny preset's 512-token vocabulary, the default" in error and f"{rows}:1" in error
    assert "--preset" in error and "--target" in error and "--tokenizer" in error and "--skip-bad" not in error
    explicit = one_line_error(prepare_cli("--data", str(rows)))  # --preset tiny given: the vocabulary is chosen
    assert "tiny preset's 512-token vocabulary (0..511)" in explicit and "the default" not in explicit
