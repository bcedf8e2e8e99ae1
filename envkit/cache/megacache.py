"""torch's Mega-Cache blob (`torch.compiler.save_cache_artifacts`) read as data, without torch.

An export is checked here before any byte of it reaches torch, which writes each artifact under its
key and unpickles some of them (HAZARDS.md H5). Layout (torch.utils._appending_byte_serializer):
crc32 (4 bytes, big endian) of the rest | uint64 version (1) | then per artifact type:
str type, uint64 count, count x (str key, bytes content); str = base64 of UTF-8 as bytes,
bytes = uint64 length + payload; integers big endian.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import zlib
from dataclasses import dataclass

ENCODING_VERSION = 1
# Kinds the trainer's compiles produce: inductor graphs, AOTAutograd entries, Triton autotune results.
# Others (dynamo precompile packages, PGO profiles) are never accepted from an export.
ACCEPTED_KINDS = frozenset({"inductor", "aot_autograd", "autotune"})
# A key becomes a path under the cache dir: plain relative components only.
KEY_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")


class BlobError(ValueError):
    """The blob is not a well-formed Mega-Cache, or holds something envkit does not accept."""


@dataclass(frozen=True)
class Artifact:
    kind: str
    key: str
    sha256: str
    size: int


def _key_ok(key: str) -> bool:
    parts = key.split("/")
    return len(key) <= 255 and all(KEY_COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 4

    def done(self) -> bool:
        return self.at == len(self.data)

    def uint64(self) -> int:
        if self.at + 8 > len(self.data):
            raise BlobError("truncated (an integer runs past the end)")
        value = int.from_bytes(self.data[self.at:self.at + 8], "big")
        self.at += 8
        return value

    def raw(self) -> bytes:
        size = self.uint64()
        if self.at + size > len(self.data):
            raise BlobError("truncated (a field runs past the end)")
        value = self.data[self.at:self.at + size]
        self.at += size
        return value

    def text(self) -> str:
        try:
            return base64.b64decode(self.raw(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise BlobError("a name is not base64 of UTF-8 text") from None


def parse(blob: bytes) -> list[Artifact]:
    """Every artifact of the blob, each kind and key checked; BlobError on anything else."""
    if len(blob) < 12:
        raise BlobError("too short to be a Mega-Cache blob")
    if zlib.crc32(blob[4:]).to_bytes(4, "big") != blob[:4]:
        raise BlobError("checksum mismatch (corrupted or altered)")
    reader = _Reader(blob)
    if reader.uint64() != ENCODING_VERSION:
        raise BlobError("unknown encoding version (made by another torch?)")
    artifacts = []
    while not reader.done():
        kind = reader.text()
        if kind not in ACCEPTED_KINDS:
            raise BlobError(f"artifact kind {kind!r} is not accepted (only {', '.join(sorted(ACCEPTED_KINDS))})")
        for _ in range(reader.uint64()):
            key = reader.text()
            if not _key_ok(key):
                raise BlobError(f"artifact key {key!r} is not a plain relative name (it could write outside the cache)")
            content = reader.raw()
            artifacts.append(Artifact(kind, key, hashlib.sha256(content).hexdigest(), len(content)))
    if not artifacts:
        raise BlobError("holds no artifacts")
    return artifacts
