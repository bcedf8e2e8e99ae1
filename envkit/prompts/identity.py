"""A prompt's identity: the digest of its normalised user turns. Two rows that ask the same thing (case and spacing
aside) are one prompt, and the digest alone decides whether a prompt is held out: never chance, so a growing set
never moves a held-out prompt into training, and one prompt is held out from every source alike."""

from __future__ import annotations

import hashlib


def normalised(text: str) -> str:
    return " ".join(text.lower().split()).strip(" \t\"'`.,;:!?")


def prompt_id(texts: list[str]) -> str:
    return hashlib.sha256("\x1e".join(normalised(text) for text in texts).encode()).hexdigest()[:16]


def is_held_out(row_id: str, share: float) -> bool:
    return int(row_id[:8], 16) / 16 ** 8 < share


def user_texts(row: object) -> list[str] | None:
    """What a prompt row asks: its user turns (`conversations`), or its `prompt`/`text`; None for another shape."""
    if not isinstance(row, dict):
        return None
    messages = row.get("conversations")
    if isinstance(messages, list):
        texts = [turn.get("content") for turn in messages if isinstance(turn, dict) and turn.get("role") == "user"]
        return texts if texts and all(isinstance(text, str) for text in texts) else None
    text = row.get("prompt", row.get("text"))
    return [text] if isinstance(text, str) and text else None
