"""A prompt row to a request, and the server's answer back into a training row.

- `conversations` rows go to chat completions: the last assistant turn is replaced by the server's (or added when
  the row ends on a user turn).
- `prompt` (or `text`) rows go to completions: the row gains `completion` (the server's continuation) and `text`
  (prompt + completion). The trainer supervises only the completion of such a row (trainer/data/rows.py).
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("system", "user", "assistant", "tool")


class BadRow(ValueError):
    """A prompt row that is not one of the shapes above (the message names what is wrong)."""


@dataclass(frozen=True)
class Request:
    endpoint: str  # "chat/completions" or "completions"
    payload: dict  # messages or prompt (the sampling settings are added per run)


def request_for(row: object) -> Request:
    if not isinstance(row, dict):
        raise BadRow("expected a JSON object")
    if "conversations" in row:
        messages = row["conversations"]
        if not isinstance(messages, list) or not messages:
            raise BadRow("`conversations` must be a non-empty list of {role, content}")
        for message in messages:
            if not (isinstance(message, dict) and message.get("role") in ROLES
                    and isinstance(message.get("content"), str)):
                raise BadRow("each turn needs a role (system, user, assistant, tool) and a string content")
        if messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages or messages[-1]["role"] != "user":
            raise BadRow("the conversation must end on a user turn (or a user turn and the answer to replace)")
        return Request("chat/completions", {"messages": messages})
    prompt = row.get("prompt", row.get("text"))
    if not isinstance(prompt, str) or not prompt:
        raise BadRow("expected `conversations`, or a non-empty string `prompt` or `text`")
    return Request("completions", {"prompt": prompt})


def answered(row: dict, request: Request, text: str) -> dict:
    """The training row: the input row with the server's answer in place."""
    if request.endpoint == "chat/completions":
        return {**row, "conversations": [*request.payload["messages"], {"role": "assistant", "content": text}]}
    prompt = request.payload["prompt"]
    return {**row, "prompt": prompt, "completion": text, "text": prompt + text}
