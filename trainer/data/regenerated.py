"""What a training row is, for the one that writes it (`envkit data regenerate`) and every one that reads it
(prepare's workers, the trainer's row parser): which keys the trainer supervises, in which order it looks for
them, and how a regenerated row is built so that nothing rendered from the old answer survives beside the new one.

A row supervises through exactly one shape, the first of SHAPES it holds:
- `input_ids` (with `loss_mask`): tokens as they are;
- `prompt` + `completion`: the completion only (a regenerated completion row);
- `text`: every token;
- `conversations`: the assistant turns, through the chat template.
A prompt row handed to regenerate may carry keys of an earlier shape (a row prepared for training keeps its
`input_ids`, a rendered `text`): the regenerated row drops every one of them, so the shape the reader finds is the
answer's. Torch-free: envkit imports it.
"""

from __future__ import annotations

SHAPES = ("input_ids", "completion", "text", "conversations")
# Every key a reader takes tokens or supervision from: a regenerated row holds none of them but its answer's.
TRAINING_KEYS = frozenset({"input_ids", "loss_mask", "prompt", "completion", "text", "conversations"})


def shape_of(row: dict) -> str | None:
    """The shape the reader trains on (SHAPES), or None for a row with none of them."""
    if "input_ids" in row:
        return "input_ids"
    if "prompt" in row and "completion" in row:
        return "completion"
    if "text" in row:
        return "text"
    if "conversations" in row:
        return "conversations"
    return None


def _kept(row: dict) -> dict:
    """The row's own keys that no reader trains on (ids, sources, metadata), in their order."""
    return {key: value for key, value in row.items() if key not in TRAINING_KEYS}


def conversation_row(row: dict, conversation: list[dict]) -> dict:
    """A regenerated chat row: the conversation with the target's answers, the row's other keys kept."""
    return {**_kept(row), "conversations": conversation}


def completion_row(row: dict, prompt: str, completion: str) -> dict:
    """A regenerated completion row: the prompt and the target's continuation (the only supervised part)."""
    return {**_kept(row), "prompt": prompt, "completion": completion}
