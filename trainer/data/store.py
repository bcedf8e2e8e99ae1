"""Token stores: a data file prepared once into flat, memory-mapped arrays that every rank reads.

`prepare()` turns JSONL (`input_ids`/`loss_mask`, `text`, `conversations`) or plain text into
`$ENVKIT_HOME/data/KEY/` (KEY: a digest of the source's bytes, the tokenizer's files, the template
kwargs and this data code), in the nanoGPT/Megatron style: numpy arrays on disk, no Python object
per token (the JSONL read into lists cost 54 bytes a token; here 2 or 4 plus 1):

    tokens.bin       every row's token ids, end to end (uint16 when the vocabulary fits, else uint32)
    loss_mask.bin    one byte per token: 1 where the token is supervised
    offsets.bin      int64, rows + 1: row r is tokens[offsets[r]:offsets[r + 1]]
    row_hash.bin     uint64 per row: a hash of the row's source bytes (the held-out split; stable when rows
                     are appended)
    first_supervised.bin  int64 per row: the first supervised position >= 1 (-1: none; such a row cannot train)
    manifest.json    sources (size, sha256, and the sha256 of each chunk tokenized), tokenizer files' digests,
                     template kwargs, the data code's digest, counts, every file's size and sha256, and for
                     regenerated data what produced it (`provenance`: model, engine, sampling); written last

It is built in worker processes over byte ranges of the file (every core; memory bounded by the
chunks in flight, whatever the file's size), into a temporary sibling renamed into place under a
lock, so a killed prepare leaves nothing a later run takes as built. On load the files' sizes are
checked against the manifest and the dir must be the user's (`--verify` re-hashes every byte).
Torch-free: workers start without importing torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.common.errors import TrainerInputError
from trainer.common.files import atomic_write, envkit_home, file_sha256, open_lock_file, read_json_file
from trainer.data.rows import OutsideVocabulary, parse_line, text_tokens
from trainer.data.store_reader import ARRAYS, FORMAT, MANIFEST, open_store, read_manifest, token_dtype
from trainer.data.source_digest import changed_while_read, file_identity, source_sha256

CHUNK_BYTES = 4 << 20  # a worker's share of the file; a few of these in flight bound the memory
LINE_LIMIT = 64 << 20  # a JSONL row longer than this is refused: one line is parsed whole, in memory
TEXT_PIECE = 512  # plain text is stored in pieces of this many tokens (split further to the largest bucket)
JSONL_SUFFIXES = (".jsonl", ".json")


def data_root() -> Path:
    return envkit_home() / "data"


def code_digest() -> str:
    """The data code: a change in how lines become tokens is a new store."""
    digest = hashlib.sha256()
    for module in ("store.py", "store_reader.py", "rows.py"):
        digest.update((Path(__file__).parent / module).read_bytes())
    return digest.hexdigest()


def _tokenizer_files(tokenizer_dir: str | None) -> dict[str, str]:
    if not tokenizer_dir:
        return {}
    root = Path(tokenizer_dir)
    return {p.name: file_sha256(p) for p in sorted(root.iterdir()) if p.is_file() and not p.is_symlink()
            and p.suffix in (".json", ".txt", ".model", ".jinja", ".tiktoken")}


def _source(path: Path) -> dict:
    info = path.stat()
    return {"path": str(path.absolute()), "name": path.name, "size": info.st_size,
            "sha256": source_sha256(path, data_root() / ".sources")}


def provenance(source_path: Path, sha256: str) -> dict | None:
    """What produced the data file, when `envkit data regenerate` wrote it: its manifest beside the file, counted
    only while the sha256 it records for its output is this file's."""
    try:
        record = read_json_file(source_path.with_name(source_path.name + ".manifest.json"), limit=16 << 20)
    except (ValueError, OSError):
        return None
    if not isinstance(record, dict) or record.get("status") != "complete" or record.get("output_sha256") != sha256:
        return None
    return {key: record.get(key) for key in ("model", "engines", "settings", "prompts", "prompts_sha256", "servers",
                                              "observed", "rows", "failed")}


def store_key(source: dict, tokenizer_files: dict, template_kwargs: dict | None, vocab_size: int | None) -> str:
    spec = {"format": FORMAT, "source": [source["size"], source["sha256"]], "tokenizer": tokenizer_files,
            "template_kwargs": template_kwargs, "vocab_size": vocab_size, "code": code_digest()}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


# -- one chunk, in a worker ------------------------------------------------------------------------------------
_TOKENIZERS: dict = {}


def _tokenizer(tokenizer_dir: str | None):
    if not tokenizer_dir:
        return None
    if tokenizer_dir not in _TOKENIZERS:
        from transformers import AutoTokenizer  # only text and conversations need it (and its import time)

        _TOKENIZERS[tokenizer_dir] = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return _TOKENIZERS[tokenizer_dir]


@dataclass(frozen=True)
class ChunkJob:
    path: str
    start: int
    end: int
    text: bool  # plain text, not JSONL
    tokenizer_dir: str | None
    template_kwargs: dict | None
    vocab_size: int | None
    skip_bad: bool


def _first_supervised(mask: list[int]) -> int:
    return next((i for i in range(1, len(mask)) if mask[i]), -1)  # text pieces: every token, so at once


def prepare_chunk(job: ChunkJob) -> dict:
    """Rows of the lines in [start, end) of the file: token and mask bytes, row lengths, hashes; the bad lines."""
    with open(job.path, "rb") as handle:
        handle.seek(job.start)
        data = handle.read(job.end - job.start)
    read_sha256 = hashlib.sha256(data).hexdigest()  # what was tokenized: --verify compares it with the source
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    tokenizer = _tokenizer(job.tokenizer_dir)
    dtype = token_dtype(job.vocab_size)
    ids: list[np.ndarray] = []
    mask: list[np.ndarray] = []
    lengths, hashes, firsts, bad = [], [], [], []
    if job.text:
        if tokenizer is None:
            raise TrainerInputError("text data needs a tokenizer; give --tokenizer PATH or --target PATH")
        try:
            seq = text_tokens(tokenizer, data.decode("utf-8"), job.vocab_size)
        except UnicodeDecodeError as exc:
            raise TrainerInputError(f"{job.path} is not UTF-8 text ({exc}); give UTF-8 text or JSONL") from None
        pieces = [(seq.input_ids[i:i + TEXT_PIECE], seq.loss_mask[i:i + TEXT_PIECE])
                  for i in range(0, len(seq.input_ids), TEXT_PIECE)]
        for piece_ids, piece_mask in pieces:
            ids.append(np.asarray(piece_ids, dtype=dtype))
            mask.append(np.asarray(piece_mask, dtype=np.uint8))
            lengths.append(len(piece_ids))
            hashes.append(_hash(np.asarray(piece_ids, dtype=np.int64).tobytes()))
            firsts.append(_first_supervised(piece_mask))
    else:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                seq = parse_line(line, job.vocab_size, tokenizer, job.template_kwargs)
            except TrainerInputError as exc:
                return {"error": (number, str(exc), False), "lines": len(lines)}
            except OutsideVocabulary as exc:
                if not job.skip_bad:  # the vocabulary may be the wrong one, not the line: prepare() names it
                    return {"error": (number, str(exc), "vocabulary"), "lines": len(lines)}
                bad.append(number)
                continue
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                if not job.skip_bad:
                    return {"error": (number, f"malformed line ({exc}); fix it or pass --skip-bad", True),
                            "lines": len(lines)}
                bad.append(number)
                continue
            row_mask = np.asarray(seq.loss_mask, dtype=np.uint8)
            ids.append(np.asarray(seq.input_ids, dtype=dtype))
            mask.append(row_mask)
            lengths.append(len(row_mask))
            hashes.append(_hash(line.strip()))
            supervised = np.flatnonzero(row_mask[1:])
            firsts.append(int(supervised[0]) + 1 if len(supervised) else -1)
    return {"tokens": np.concatenate(ids).tobytes() if ids else b"",
            "loss_mask": np.concatenate(mask).tobytes() if mask else b"",
            "lengths": np.asarray(lengths, dtype=np.int64), "row_hash": np.asarray(hashes, dtype=np.uint64),
            "first_supervised": np.asarray(firsts, dtype=np.int64), "bad": bad, "lines": len(lines),
            "sha256": read_sha256}


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _chunks(path: Path, size: int, text: bool) -> list[tuple[int, int]]:
    """Byte ranges of about CHUNK_BYTES that end at a newline (a JSONL line is never split). Plain text with no
    newline in reach is cut at a space, else between UTF-8 characters, so one enormous line never becomes one
    chunk: a worker's memory stays bounded whatever the file."""
    bounds, start = [], 0
    with path.open("rb") as handle:
        while start < size:
            if start + CHUNK_BYTES >= size:
                bounds.append((start, size))
                break
            handle.seek(start + CHUNK_BYTES)
            reach = LINE_LIMIT if not text else CHUNK_BYTES
            rest = handle.readline(reach)
            if rest.endswith(b"\n") or start + CHUNK_BYTES + len(rest) >= size:
                end = start + CHUNK_BYTES + len(rest)
            elif not text:
                raise TrainerInputError(f"{path}: the line at byte {start} and after is longer than "
                                        f"{LINE_LIMIT >> 20} MiB; a JSONL row must be shorter (split the row)")
            else:
                end = start + CHUNK_BYTES + _text_cut(rest)
            bounds.append((start, end))
            start = end
    return bounds


def _text_cut(piece: bytes) -> int:
    """Where to end a text chunk inside `piece`: after its last space, else at its last UTF-8 character's start."""
    space = max(piece.rfind(b" "), piece.rfind(b"\t"))
    if space >= 0:
        return space + 1
    cut = len(piece) - 1
    while cut > 0 and piece[cut] & 0xC0 == 0x80:  # a continuation byte: the character started before it
        cut -= 1
    return cut


# -- the store ---------------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    store: str
    key: str
    rows: int
    tokens: int
    skipped: int  # malformed lines skipped with --skip-bad
    untrainable: int  # rows with no supervised token after the first (they cannot train)
    seconds: float
    reused: bool
    rows_per_s: float


def prepare(path: str | Path, *, tokenizer_dir: str | None = None, template_kwargs: dict | None = None,
            skip_bad: bool = False, vocab_size: int | None = None, workers: int | None = None,
            log=print, progress=None, vocabulary: str | None = None) -> Prepared:
    """The store of `path`, prepared now or found intact from before. `vocabulary` says where `vocab_size` came
    from (an id outside it is then named with it and how to choose another)."""
    started = time.perf_counter()
    source_path = Path(path)
    if not source_path.is_file():
        raise TrainerInputError(f"data file {path} does not exist or is not a regular file")
    identity = file_identity(source_path)
    source = _source(source_path)
    tokenizer_files = _tokenizer_files(tokenizer_dir)
    key = store_key(source, tokenizer_files, template_kwargs, vocab_size)
    root = data_root()
    out = root / key
    if not (out / MANIFEST).exists():
        root.mkdir(parents=True, exist_ok=True)
        try:
            lock = open_lock_file(root / f".{key}.lock")
        except ValueError as exc:
            raise TrainerInputError(str(exc)) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # ranks and runs of one node prepare it once
            if not (out / MANIFEST).exists():
                for stale in root.glob(f".{key}.tmp-*"):  # a killed prepare's; we hold the lock, none is live
                    shutil.rmtree(stale, ignore_errors=True)
                _build(source_path, source, tokenizer_files, template_kwargs, skip_bad, vocab_size, tokenizer_dir,
                       out, workers or os.cpu_count() or 1, log, progress, identity, vocabulary)
                manifest = read_manifest(out)
                return _prepared(out, manifest, started, reused=False)
        finally:
            os.close(lock)
    manifest = open_store(out).manifest
    return _prepared(out, manifest, started, reused=True)


def _prepared(out: Path, manifest: dict, started: float, *, reused: bool) -> Prepared:
    counts = manifest["counts"]
    seconds = time.perf_counter() - started
    return Prepared(str(out), out.name, counts["rows"], counts["tokens"], counts["skipped"], counts["untrainable"],
                    round(seconds, 2), reused, round(manifest["rows_per_s"], 1))


def _build(source_path: Path, source: dict, tokenizer_files: dict, template_kwargs, skip_bad: bool, vocab_size,
           tokenizer_dir, out: Path, workers: int, log, progress, identity: dict, vocabulary: str | None) -> None:
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        text = source_path.suffix not in JSONL_SUFFIXES
        jobs = [ChunkJob(str(source_path), start, end, text, tokenizer_dir, template_kwargs, vocab_size, skip_bad)
                for start, end in _chunks(source_path, source["size"], text)]
        handles = {name: (tmp / f"{name}.bin").open("wb") for name in ARRAYS}
        counts = {"rows": 0, "tokens": 0, "skipped": 0, "untrainable": 0, "lines": 0}
        handles["offsets"].write(np.zeros(1, dtype=np.int64).tobytes())
        done_bytes, read = 0, []
        for job, result in zip(jobs, _run(jobs, workers)):
            if "error" in result:
                line, message, kind = result["error"]
                if kind == "vocabulary" and vocabulary:  # prepare's vocabulary may be a default, not the target's
                    message = (f"{message.replace('the vocabulary', vocabulary)}; if the data is right, give its "
                               f"target's vocabulary: --preset NAME, --target DIR or --tokenizer DIR")
                elif kind == "vocabulary":  # the run's own target: the line is wrong
                    message = f"malformed line ({message}); fix it or pass --skip-bad"
                raise TrainerInputError(f"{source_path}:{counts['lines'] + line}: {message}")
            handles["tokens"].write(result["tokens"])
            handles["loss_mask"].write(result["loss_mask"])
            offsets = counts["tokens"] + np.cumsum(result["lengths"])
            handles["offsets"].write(offsets.astype(np.int64).tobytes())
            handles["row_hash"].write(result["row_hash"].tobytes())
            handles["first_supervised"].write(result["first_supervised"].tobytes())
            counts["rows"] += len(result["lengths"])
            counts["tokens"] += int(result["lengths"].sum())
            counts["skipped"] += len(result["bad"])
            counts["untrainable"] += int((result["first_supervised"] < 0).sum())
            counts["lines"] += result["lines"]
            read.append([job.start, job.end, result["sha256"]])
            done_bytes += job.end - job.start
            if progress:
                progress(done_bytes, source["size"], counts["rows"], time.perf_counter() - started)
        for handle in handles.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        if file_identity(source_path) != identity:  # the digest in the key is of the bytes the workers read
            raise changed_while_read(source_path)
        if counts["rows"] == 0:
            raise TrainerInputError(f"{source_path} holds no row of data (every line empty or skipped)")
        seconds = time.perf_counter() - started
        manifest = {"format": FORMAT, "source": source, "tokenizer": tokenizer_dir, "tokenizer_files": tokenizer_files,
                    "template_kwargs": template_kwargs, "vocab_size": vocab_size, "code": code_digest(),
                    "kind": "text" if text else "jsonl", "token_dtype": np.dtype(token_dtype(vocab_size)).name,
                    "source_chunks": read, "provenance": provenance(source_path, source["sha256"]),
                    "counts": counts, "seconds": round(seconds, 2), "rows_per_s": counts["rows"] / max(seconds, 1e-9),
                    "files": {f"{name}.bin": {"size": (tmp / f"{name}.bin").stat().st_size,
                                               "sha256": file_sha256(tmp / f"{name}.bin")} for name in ARRAYS}}
        atomic_write(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")  # the marker: last
        os.chmod(tmp, 0o755 & ~_umask())
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _run(jobs: list[ChunkJob], workers: int):
    """Each job's result in order, at most 2 x workers in flight (memory stays bounded whatever the file)."""
    if workers <= 1 or len(jobs) <= 1:
        yield from map(prepare_chunk, jobs)
        return
    # forkserver: workers start from a clean interpreter (the trainer's process has torch and its threads).
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        pending = []
        for job in jobs:
            pending.append(pool.submit(prepare_chunk, job))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


class Progress:
    """A progress line on stderr every few seconds and at the end (whole lines: they land in train.log too)."""

    def __init__(self, every_s: float = 3.0):
        self.every_s, self.last = every_s, 0.0

    def __call__(self, done: int, total: int, rows: int, seconds: float) -> None:
        if done < total and seconds - self.last < self.every_s:
            return
        self.last = seconds
        print(f"prepare: {done / max(total, 1):6.1%} of {total / 2**20:,.0f} MiB, {rows:,} rows "
              f"({rows / max(seconds, 1e-9):,.0f} rows/s)", file=sys.stderr, flush=True)
