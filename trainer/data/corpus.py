"""The text every machine has: the running interpreter's standard-library sources, split by file.

No weights or data sets can be downloaded where envkit trains, but the standard library's Python files
are real code written by people. A file is held out when the first byte of the sha256 of its relative
path is below HELD_OUT_BYTES: deterministic, disjoint by construction, and the same on every machine
with the same Python. Torch-free: `describe` and the tests read it without starting torch.
"""

from __future__ import annotations

import functools

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.data import INSTRUCTION_KINDS

# Directories of the stdlib that are not the library itself (tests, demos, bundled installers, GUI)
# or not ours at all (site-packages holds whatever the machine installed).
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3",
                          "tkinter", "turtledemo", "ensurepip", "pydoc_data"})
HELD_OUT_BYTES = 26  # of 256: about 10% of the files
MAX_FILE_BYTES = 512 * 1024  # a generated table, not code someone wrote


@dataclass(frozen=True)
class CorpusFile:
    relpath: str  # relative to the stdlib root, '/'-separated
    path: Path
    held_out: bool


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relpath: str) -> bool:
    return hashlib.sha256(relpath.encode()).digest()[0] < HELD_OUT_BYTES


def files(root: Path | None = None) -> list[CorpusFile]:
    """Every corpus file in a stable order (sorted relative paths); regular files only, links not followed."""
    root = root or stdlib_root()
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if set(rel.parts[:-1]) & SKIPPED_DIRS or path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        relpath = rel.as_posix()
        found.append(CorpusFile(relpath, path, is_held_out(relpath)))
    return sorted(found, key=lambda f: f.relpath)


def read(file: CorpusFile) -> str:
    return file.path.read_bytes().decode("utf-8", errors="replace")


def digest(corpus: list[CorpusFile]) -> str:
    """What a target trained on this corpus depends on: every file's path and content."""
    whole = hashlib.sha256()
    for file in corpus:
        whole.update(f"{file.relpath}\0{hashlib.sha256(file.path.read_bytes()).hexdigest()}\n".encode())
    return whole.hexdigest()


def prompts(tokenizer, held_out: bool, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` windows of `length` tokens cut from the training files (or the held-out ones) at random
    places, reproducibly for a seed: what the target continues to make the drafter's data."""
    import random

    chosen = [f for f in files() if f.held_out == held_out]
    rng = random.Random(seed)
    tokenized: dict[str, list[int]] = {}
    out: list[list[int]] = []
    for _ in range(count * 20):  # files shorter than a window are drawn again
        if len(out) == count:
            break
        file = rng.choice(chosen)
        if file.relpath not in tokenized:
            tokenized[file.relpath] = tokenizer(read(file), add_special_tokens=False)["input_ids"]
        ids = tokenized[file.relpath]
        if len(ids) > length:
            start = rng.randrange(len(ids) - length)
            out.append(ids[start:start + length])
    if len(out) < count:
        raise TrainerInputError(f"the corpus has too few files longer than {length} tokens; lower data.prompt_len")
    return out


def _definitions(held_out: bool):
    """(the file's lines, node, the class it is a method of or None) for every function and class of the training
    files (or the held-out ones), in file order."""
    import ast

    for file in (f for f in files() if f.held_out == held_out):
        source = read(file)
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        owners = {id(child): node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                  for child in node.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield lines, node, owners.get(id(node))


def _functions(held_out: bool):
    """(the file's lines, function node) for every function of the training files (or the held-out ones), in file
    order."""
    import ast

    for lines, node, _owner in _definitions(held_out):
        if not isinstance(node, ast.ClassDef):
            yield lines, node


def _sample(found: list[str], count: int, seed: int, what: str) -> list[str]:
    import random

    if len(found) < count:
        raise TrainerInputError(f"the corpus has {len(found)} {what}, fewer than {count}")
    return random.Random(seed).sample(found, count)


def function_openings(held_out: bool, count: int, seed: int, max_chars: int = 600) -> list[str]:
    """`count` docstring-led function openings (a `def` line and its docstring, dedented, ending in a newline and
    the body's indentation) from the training files (or the held-out ones), reproducibly for a seed: the prompts
    a user's code assistant is asked to complete, and what the recipe regenerates answers to."""
    import ast
    import textwrap

    found = []
    for lines, node in _functions(held_out):
        if ast.get_docstring(node) is None:
            continue
        docstring = node.body[0]
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        opening = textwrap.dedent("".join(lines[first - 1:docstring.end_lineno]))
        body_indent = " " * (docstring.col_offset - node.col_offset)
        if len(opening) <= max_chars and node.body[1:]:  # a body follows: the target has something to write
            found.append(opening.rstrip("\n") + "\n" + body_indent)
    return _sample(found, count, seed, "docstring-led functions")


EXPLAINED_MAX_CHARS = 600  # the code shown with "explain": its answer still fits the chat preset's 512-token rows


def instruction_pool(held_out: bool, kinds: tuple[str, ...] = ("function",)) -> list[str]:
    """Every instruction of these kinds that the training files (or the held-out ones) give, sorted, each once; a
    held-out text is never a training one (the standard library repeats functions across files):
    - function: "Write a Python function `NAME(SIGNATURE)`: DOCSTRING" (public functions with arguments, so the
      instruction says what to write; the docstring's first paragraph);
    - method: "Write the method `CLASS.NAME(SIGNATURE)` of a Python class `CLASS`: DOCSTRING";
    - class: "Write a Python class `NAME`: DOCSTRING";
    - tests: "Write pytest unit tests for the Python function `NAME(SIGNATURE)`, which does this: DOCSTRING";
    - explain: "Explain what this Python function does:" and a short function's code (public or not)."""
    return list(_instruction_pool(held_out, tuple(kinds)))


def _instruction_pool(held_out: bool, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """instruction_pool's work: the union of each kind's pool (a text's opening says its kind, so kinds never
    share a text), a held-out one without any training text."""
    unknown = sorted(set(kinds) - set(INSTRUCTION_KINDS))
    if unknown or not kinds:
        raise TrainerInputError(f"unknown instruction kind {unknown[0] if unknown else '(none given)'}; known: "
                                f"{', '.join(INSTRUCTION_KINDS)}")
    found = set().union(*(_pools_by_kind(held_out)[kind] for kind in kinds))
    if held_out:
        found -= set().union(*(_pools_by_kind(False)[kind] for kind in kinds))
    return tuple(sorted(found))


@functools.lru_cache(maxsize=2)  # the stdlib parsed once per process and split (seconds each time)
def _pools_by_kind(held_out: bool) -> dict[str, frozenset[str]]:
    """Every kind's instructions from the training files (or the held-out ones), in one pass over them."""
    import ast
    import textwrap

    found: dict[str, set[str]] = {kind: set() for kind in INSTRUCTION_KINDS}
    for lines, node, owner in _definitions(held_out):
        docstring = ast.get_docstring(node)
        summary = " ".join(docstring.split("\n\n")[0].split()) if docstring else ""
        documented = 20 <= len(summary) <= 300
        if not isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            code = textwrap.dedent("".join(lines[first - 1:node.end_lineno]))
            if len(node.body) > 1 and len(code) <= EXPLAINED_MAX_CHARS:
                found["explain"].add(f"Explain what this Python function does:\n\n```python\n{code.rstrip()}\n```")
        if not documented or node.name.startswith("_"):
            continue
        if isinstance(node, ast.ClassDef):
            found["class"].add(f"Write a Python class `{node.name}`: {summary}")
            continue
        arguments = ast.unparse(node.args)
        if not isinstance(node, ast.FunctionDef) or len(arguments) > 80 or not node.args.args:
            continue
        if node.args.args[0].arg not in ("self", "cls"):  # a function, not a method
            found["function"].add(f"Write a Python function `{node.name}({arguments})`: {summary}")
            found["tests"].add(f"Write pytest unit tests for the Python function `{node.name}({arguments})`, which "
                               f"does this: {summary}")
        elif owner and not owner.startswith("_"):
            found["method"].add(f"Write the method `{owner}.{node.name}({arguments})` of a Python class `{owner}`: "
                                f"{summary}")
    return {kind: frozenset(texts) for kind, texts in found.items()}


def instructions(held_out: bool, count: int, seed: int, kinds: tuple[str, ...] = ("function",)) -> list[str]:
    """`count` instructions a user gives a chat model (instruction_pool's), drawn reproducibly for a seed."""
    what = "documented public functions" if kinds == ("function",) else f"instructions of kinds {', '.join(kinds)}"
    return _sample(instruction_pool(held_out, kinds), count, seed, what)
