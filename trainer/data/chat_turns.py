"""A chat template cut into the pieces around each turn's text, so that a client can write prompts the target's
own way (Magpie: the template rendered up to where a user's message begins, the model left to write the message).

Rendered with sentinel texts, a conversation reads
    BEFORE_USER + user_1 + USER_TO_ASSISTANT + assistant_1 + ASSISTANT_TO_USER + user_2 + ...
A template is `composable` when a two-round conversation renders exactly so; only then may a client append turns by
concatenation (`synthesize --turns K`). Templates that render earlier turns differently (thinking dropped from past
answers, a system prompt that depends on the count) are refused for follow-up turns, never approximated.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from trainer.common.errors import TrainerInputError

SENTINELS = ("\x1eU1\x1e", "\x1eA1\x1e", "\x1eU2\x1e", "\x1eA2\x1e")


def _render(tokenizer, contents: tuple[str, ...], template_kwargs: dict | None) -> str:
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(contents)]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False,
                                         **(template_kwargs or {}))


def _split(rendered: str, sentinels: tuple[str, ...], where: str) -> list[str]:
    """The text around each sentinel, in order; a template that drops or reorders one is refused."""
    pieces, rest = [], rendered
    for sentinel in sentinels:
        before, found, rest = rest.partition(sentinel)
        if not found:
            raise TrainerInputError(f"{where}: its chat template does not render a "
                                    f"{'user' if sentinel in SENTINELS[::2] else 'assistant'} message where one "
                                    f"belongs (a template with no user turn cannot be prompted Magpie-style)")
        pieces.append(before)
    return pieces + [rest]


def chat_turns(tokenizer_dir: str, template_kwargs: dict | None = None) -> dict:
    """The template's pieces around the turns of a conversation, the stop text that ends a user turn, and whether
    turns compose by concatenation. Raises TrainerInputError for a tokenizer without a usable chat template."""
    from transformers import AutoTokenizer

    where = f"--tokenizer {tokenizer_dir}"
    if not Path(tokenizer_dir).is_dir():
        raise TrainerInputError(f"{where}: not a directory (give the target's model dir, or its tokenizer's)")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise TrainerInputError(f"{where}: the tokenizer has no chat template; prompts are written by an instruct "
                                f"model through its template")
    try:
        one = _render(tokenizer, SENTINELS[:1], template_kwargs)
        two = _render(tokenizer, SENTINELS, template_kwargs)
    except Exception as exc:  # a template's own raise_exception, or a Jinja error: the template's word, one line
        raise TrainerInputError(f"{where}: its chat template failed to render a conversation "
                                f"({type(exc).__name__}: {str(exc)[:200]})") from None
    before_user, after_user = _split(one, SENTINELS[:1], where)
    pieces = _split(two, SENTINELS, where)
    user_to_assistant, assistant_to_user = pieces[1], pieces[2]
    # The user turn's end as the model writes it: the template's text after a user message, to its first line end
    # (ChatML's <|im_end|>, Llama 3's <|eot_id|>, Mistral's [/INST]).
    stop = (after_user.strip().splitlines() or [""])[0].strip() or user_to_assistant.strip()[:32]
    if not stop or not before_user.strip():
        raise TrainerInputError(f"{where}: its chat template marks no user turn (nothing before a user message, or "
                                f"nothing that ends one), so the target cannot be asked to write one")
    composable = (pieces[0] == before_user and pieces[3] == user_to_assistant)
    digest = hashlib.sha256(tokenizer.chat_template.encode() if isinstance(tokenizer.chat_template, str)
                            else repr(tokenizer.chat_template).encode()).hexdigest()
    return {"before_user": before_user, "user_to_assistant": user_to_assistant, "assistant_to_user": assistant_to_user,
            "user_stop": stop, "composable": composable, "template_sha256": digest,
            "template_kwargs": template_kwargs}
