"""`envkit data mix`: prompt sources (prompts the target wrote, instructions of every kind, a user's own file) in one
training file, each row tagged with its source and id, and a held-out file per source, so that a walk can report
acceptance per kind of traffic.

Rows stream through (memory holds the set of ids seen, not the rows); a prompt that an earlier source already gave
is counted as a duplicate and kept once. The held-out split is each prompt's digest (identity.py), the same rule
`data synthesize` uses, so a synthesized file's held-out rows stay held out here. Every file is written to a
temporary sibling and renamed; the manifest, written last, records each source's sha256 and counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from envkit import __version__
from envkit.errors import EnvkitError
from envkit.prompts.identity import is_held_out, prompt_id, user_texts
from envkit.support.fsops import write_json_atomic
from envkit.support.text import printable
from envkit.support.trainer_helpers import loads_exchanged_json

SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")  # also part of a file name
ROW_LIMIT = 64 << 20


@dataclass(frozen=True)
class Source:
    name: str
    path: Path


@dataclass
class SourceCounts:
    file: str
    sha256: str = ""
    rows: int = 0
    train: int = 0
    held_out: int = 0
    duplicates: int = 0
    held_out_file: str = ""


@dataclass
class MixResult:
    out: str
    manifest: str
    train_rows: int
    sources: dict[str, SourceCounts] = field(default_factory=dict)


def parse_source(text: str) -> Source:
    name, sep, path = text.partition("=")
    if not sep or not SOURCE_NAME.match(name) or not path:
        raise EnvkitError(f"--source {printable(text)!r}: give NAME=FILE (NAME: letters, digits, _ and -)")
    if not Path(path).is_file():
        raise EnvkitError(f"--source {printable(name)}: {printable(path)} is not a file")
    return Source(name, Path(path))


def held_out_path(out: Path, name: str) -> Path:
    return out.with_name(f"{out.name.removesuffix('.jsonl')}.held-out.{name}.jsonl")


def _rows(source: Source):
    """(line number, row, its raw line) of a source file; a line that is not a prompt row stops with FILE:LINE."""
    with source.path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            if len(raw) > ROW_LIMIT:
                raise EnvkitError(f"{printable(str(source.path))}:{number}: a row over {ROW_LIMIT >> 20} MiB")
            try:
                row = loads_exchanged_json(raw)
            except ValueError as exc:
                raise EnvkitError(f"{printable(str(source.path))}:{number}: not JSON ({printable(exc)})") from None
            if user_texts(row) is None:
                raise EnvkitError(f"{printable(str(source.path))}:{number}: not a prompt row (expected "
                                  f"`conversations` with a user turn, or a `prompt`/`text` string)")
            yield number, row, raw


def mix(sources: list[Source], out: Path, share: float) -> MixResult:
    names = [source.name for source in sources]
    if not sources:
        raise EnvkitError("give at least one --source NAME=FILE")
    if len(set(names)) != len(names):
        raise EnvkitError(f"--source names must differ: {printable(', '.join(names))}")
    if not 0 <= share < 1:
        raise EnvkitError(f"--held-out {share}: give a share in [0, 1)")
    targets = [out, *(held_out_path(out, name) for name in names), out.with_name(out.name + ".manifest.json")]
    temps = {path: path.with_name(f".{path.name}.tmp-{os.getpid()}") for path in targets}
    seen: set[str] = set()
    result = MixResult(str(out), str(targets[-1]), 0)
    try:
        with temps[out].open("w", encoding="utf-8") as train:
            for source in sources:
                counts = result.sources[source.name] = SourceCounts(str(source.path.absolute()))
                counts.held_out_file = held_out_path(out, source.name).name
                digest = hashlib.sha256()
                with temps[held_out_path(out, source.name)].open("w", encoding="utf-8") as held:
                    for _, row, raw in _rows(source):
                        digest.update(raw)
                        counts.rows += 1
                        row_id = prompt_id(user_texts(row))
                        if row_id in seen:
                            counts.duplicates += 1
                            continue
                        seen.add(row_id)
                        line = json.dumps(row | {"id": row_id, "source": source.name}, ensure_ascii=False) + "\n"
                        if is_held_out(row_id, share):
                            held.write(line)
                            counts.held_out += 1
                        else:
                            train.write(line)
                            counts.train += 1
                counts.sha256 = digest.hexdigest()  # of the rows read (a file changed while read: other bytes)
        result.train_rows = sum(counts.train for counts in result.sources.values())
        for path in targets[:-1]:
            os.replace(temps[path], path)
        write_json_atomic(targets[-1], {"format": 1, "held_out_share": share, "train_rows": result.train_rows,
                                        "sources": {name: vars(counts) for name, counts in result.sources.items()},
                                        "envkit": __version__}, mode=0o644)  # last: the mix is whole
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)
    return result
