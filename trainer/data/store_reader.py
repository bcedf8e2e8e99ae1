"""Reading a token store (store.py prepares one): its manifest checked, its arrays memory-mapped, every file
checked against the manifest's size (and with verify its sha256), and its rows checked against the source bytes."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.common.errors import TrainerInputError
from trainer.common.files import file_sha256, permission_problem, read_json_record
from trainer.data.rows import Sequence

FORMAT = 2  # 2: the manifest holds each chunk's sha256 of the source bytes that were tokenized
MANIFEST = "manifest.json"
ARRAYS = {"tokens": None, "loss_mask": np.uint8, "offsets": np.int64, "row_hash": np.uint64,
          "first_supervised": np.int64}
TOKEN_DTYPES = ("uint16", "uint32")  # what token_dtype writes; a manifest naming another is not a store


def token_dtype(vocab_size: int | None):
    return np.uint16 if vocab_size is not None and vocab_size <= 1 << 16 else np.uint32


def read_manifest(out: Path) -> dict:
    manifest = read_json_record(out / MANIFEST)
    files = manifest.get("files") if manifest else None
    if not (manifest and manifest.get("format") == FORMAT and isinstance(files, dict)
            and set(files) == {f"{name}.bin" for name in ARRAYS} and isinstance(manifest.get("counts"), dict)):
        raise TrainerInputError(f"the token store {str(out)!r} has no readable {MANIFEST} of format {FORMAT}; "
                                f"remove it (`rm -r {out}`) and it is prepared again on next use")
    vocab_size = manifest.get("vocab_size")
    expected = np.dtype(token_dtype(vocab_size if isinstance(vocab_size, int) else None)).name
    if manifest.get("token_dtype") != expected:
        # A float or object dtype would fail every load; int16 or float16 would reinterpret the ids silently.
        raise TrainerInputError(f"the token store {str(out)!r} names token_dtype "
                                f"{str(manifest.get('token_dtype'))[:40]!r}, not the {expected} it writes for its "
                                f"vocabulary; remove it (`rm -r {out}`) and it is prepared again on next use")
    return manifest


@dataclass
class TokenStore:
    """A prepared store, memory-mapped: nothing is read until a row is."""
    path: Path
    manifest: dict
    tokens: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    row_hash: np.ndarray
    first_supervised: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.row_hash)

    def row(self, index: int, start: int = 0, length: int | None = None) -> Sequence:
        begin = int(self.offsets[index]) + start
        end = int(self.offsets[index + 1]) if length is None else begin + length
        return Sequence(self.tokens[begin:end].astype(np.int64), self.loss_mask[begin:end])


def open_store(out: Path, *, verify: bool = False) -> TokenStore:
    """A store checked as a built target is: the dir is the user's, every file the manifest's size (and, with
    verify, its sha256); a changed or truncated file is an error naming it."""
    out = Path(out)
    for entry in (out, out / MANIFEST):
        problem = permission_problem(entry) if os.path.lexists(entry) else "missing"
        if problem:
            raise TrainerInputError(f"the token store {str(out)!r} cannot be trusted: {entry.name} is {problem}; "
                                    f"remove it (`rm -r {out}`) and it is prepared again on next use")
    manifest = read_manifest(out)
    arrays = {}
    for name, dtype in ARRAYS.items():
        file = out / f"{name}.bin"
        expected = manifest["files"][f"{name}.bin"]
        problem = permission_problem(file) if os.path.lexists(file) else "missing"
        if not problem and file.stat().st_size != expected.get("size"):
            problem = f"{file.stat().st_size} bytes, not the {expected.get('size')} it was prepared with"
        if not problem and verify and file_sha256(file) != expected.get("sha256"):
            problem = "changed since it was prepared (its sha256 differs)"
        if problem:
            raise TrainerInputError(f"the token store {str(out)!r}: {name}.bin is {problem}; remove the store "
                                    f"(`rm -r {out}`) and it is prepared again on next use")
        kind = np.dtype(manifest["token_dtype"]) if dtype is None else dtype
        arrays[name] = np.memmap(file, dtype=kind, mode="r") if expected["size"] else np.zeros(0, dtype=kind)
    rows = manifest["counts"]["rows"]
    if len(arrays["offsets"]) != rows + 1 or len(arrays["row_hash"]) != rows \
            or int(arrays["offsets"][-1]) != len(arrays["tokens"]):
        raise TrainerInputError(f"the token store {str(out)!r} is inconsistent (offsets and rows disagree); remove "
                                f"it (`rm -r {out}`) and it is prepared again on next use")
    return TokenStore(out, manifest, **arrays)


def verify_source(out: Path, source_path: Path) -> None:
    """The store holds rows of this file's bytes: every chunk the workers tokenized has the sha256 recorded for
    it, read again from `source_path` (a store built from bytes other than its key's is refused)."""
    manifest = read_manifest(out)
    chunks = manifest.get("source_chunks")
    if not isinstance(chunks, list) or not chunks:
        raise TrainerInputError(f"the token store {str(out)!r} records no digest of the bytes it was built from; "
                                f"remove it (`rm -r {out}`) and prepare again")
    mismatch = TrainerInputError(f"the token store {str(out)!r} holds rows of other bytes than {source_path} (the "
                                 f"file changed or was replaced while it was prepared); remove it (`rm -r {out}`) and "
                                 f"prepare again")
    covered = 0
    with open(source_path, "rb") as handle:
        for chunk in chunks:
            if not (isinstance(chunk, list) and len(chunk) == 3 and chunk[0] == covered
                    and isinstance(chunk[1], int) and chunk[1] > covered and isinstance(chunk[2], str)):
                raise mismatch
            handle.seek(chunk[0])
            if hashlib.sha256(handle.read(chunk[1] - chunk[0])).hexdigest() != chunk[2]:
                raise mismatch
            covered = chunk[1]
        if covered != os.fstat(handle.fileno()).st_size:
            raise mismatch
