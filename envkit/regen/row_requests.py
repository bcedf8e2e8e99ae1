"""A prompt row to the requests that answer it, and the answers back into a training row (trainer/data/regenerated.py
defines that row for its writer and its readers).

- `conversations` rows go to chat completions, one request per assistant turn answered, in order, each sent the
  conversation up to that turn with the earlier answers already the target's (`turns="all"`, as SpecForge and
  vLLM's speculators regenerate), or only the last one (`turns="last"`); a conversation that ends on a user turn
  gains the answer to it. System and tool turns pass through as they are; a row with `tools` or an assistant turn
  with `tool_calls` is set aside (the errors file), never answered as plain text.
- `prompt` (or `text`) rows go to completions: the row gains `completion`, the only part the trainer supervises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from envkit.support.trainer_helpers import completion_row, conversation_row

ROLES = ("system", "user", "assistant", "tool")
TURNS = ("all", "last")
TOOLS_SET_ASIDE = ("the row has tools or tool calls, which regenerate does not send: the target's answer without them "
                   "would replace a tool call with text")


class BadRow(ValueError):
    """A prompt row that is not one of the shapes above (the message names what is wrong)."""


@dataclass(frozen=True)
class Plan:
    endpoint: str  # "chat/completions" or "completions"
    messages: tuple[dict, ...] = ()  # chat: the conversation as given
    answer_at: tuple[int, ...] = ()  # chat: the turns answered anew (len(messages): an answer appended)
    prompt: str = ""  # completions
    set_aside: str | None = None  # a row regenerate cannot reproduce: to the errors file with this reason, unsent


def plan_for(row: object, turns: str = "all") -> Plan:
    if not isinstance(row, dict):
        raise BadRow("expected a JSON object")
    try:
        json.dumps(row, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise BadRow("a string holds a lone surrogate (\\ud800-\\udfff), which is not text a server can read") from None
    if "conversations" in row:
        plan = _chat_plan(row["conversations"], turns)
        if row.get("tools") or any(message.get("tool_calls") for message in plan.messages):
            # Answered without its tools, the target would write plain text where it called a tool: the row would
            # be rewritten, not regenerated. Kept out of OUT, with its reason, rather than changed.
            return Plan(plan.endpoint, plan.messages, plan.answer_at, set_aside=TOOLS_SET_ASIDE)
        return plan
    prompt = row.get("prompt", row.get("text"))
    if not isinstance(prompt, str) or not prompt:
        raise BadRow("expected `conversations`, or a non-empty string `prompt` or `text`")
    return Plan("completions", prompt=prompt)


def _chat_plan(messages: object, turns: str) -> Plan:
    if not isinstance(messages, list) or not messages:
        raise BadRow("`conversations` must be a non-empty list of {role, content}")
    for message in messages:
        if not (isinstance(message, dict) and message.get("role") in ROLES and isinstance(message.get("content"), str)):
            raise BadRow("each turn needs a role (system, user, assistant, tool) and a string content")
    assistant = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
    if messages[-1]["role"] != "assistant":
        if messages[-1]["role"] != "user":
            raise BadRow("the conversation must end on a user turn, or on an assistant turn to answer anew")
        assistant.append(len(messages))
    answer_at = assistant if turns == "all" else assistant[-1:]
    for index in answer_at:
        if index == 0 or messages[index - 1]["role"] not in ("user", "tool"):
            raise BadRow(f"turn {index + 1} is an assistant turn that answers no user or tool turn")
    return Plan("chat/completions", messages=tuple(messages), answer_at=tuple(answer_at))


def training_row(row: dict, plan: Plan, answers: list[str]) -> dict:
    """The training row: the input row with the server's answers in place (regenerated.py's contract)."""
    if plan.endpoint == "completions":
        return completion_row(row, plan.prompt, answers[0])
    return conversation_row(row, chat_history(plan, answers))


def chat_history(plan: Plan, answers: list[str]) -> list[dict]:
    """The conversation with the first len(answers) answered turns replaced (the rest not yet reached)."""
    replaced = dict(zip(plan.answer_at, answers))
    history = []
    for index in range(len(plan.messages) + 1):
        if index in replaced:
            history.append({"role": "assistant", "content": replaced[index]})
        elif index < len(plan.messages):
            history.append(plan.messages[index])
    return history
