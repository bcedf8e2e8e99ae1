"""What a written prompt must be to be kept, for every writer of prompts (`envkit data synthesize` through a
server, the device recipe through the trainer's decoder): finished, not empty, within a length range, free of the
template's own markup, not degenerate. Pure functions of the text: no client, no torch."""

from __future__ import annotations

import re
import zlib
from collections import Counter

# A written prompt's length range in characters: the defaults of `envkit data synthesize` and of the device recipe.
MIN_CHARS, MAX_CHARS = 8, 4000


def degenerate(text: str) -> bool:
    """Mostly one repeated word, line or character, or a loop (text that compresses to almost nothing)."""
    words = text.split()
    if len(words) >= 8 and Counter(words).most_common(1)[0][1] * 2 > len(words):
        return True
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) >= 4 and Counter(lines).most_common(1)[0][1] * 2 > len(lines):
        return True
    visible = [char for char in text if not char.isspace()]
    if len(visible) >= 16 and Counter(visible).most_common(1)[0][1] * 2 > len(visible):
        return True
    data = text.encode()
    return len(data) >= 256 and len(zlib.compress(data)) < 0.15 * len(data)


def template_markers(template: dict) -> list[str]:
    """Markup of the template's own turns (trainer/data/chat_turns.py's pieces): a message holding it wrote past
    its turn."""
    pieces = [template["user_stop"], *template["user_to_assistant"].split(), *template["assistant_to_user"].split()]
    return [piece for piece in dict.fromkeys(pieces) if piece and re.search(r"[<>\[\]|]", piece)]


def prompt_rejection(text: str, finish: str | None, min_chars: int, max_chars: int, markers: list[str]) -> str | None:
    """Why a written prompt is not kept (a reason counted by name), or None to keep it; `finish` is "length" when
    the writer was cut at its token limit."""
    if finish == "length":
        return "unfinished"
    if not text:
        return "empty"
    if any(marker in text for marker in markers):
        return "template"
    if len(text) < min_chars:
        return "too_short"
    if len(text) > max_chars:
        return "too_long"
    if degenerate(text):
        return "degenerate"
    return None
