"""--chat-template-kwargs, parsed once for every command that takes it (envkit's and the trainer's)."""

from __future__ import annotations

import json

from trainer.common.errors import TrainerInputError

EXAMPLE = '\'{"enable_thinking": false}\''


def parse_template_kwargs(text: str | None) -> dict | None:
    """A JSON object of finite values, or None when not given (NaN and Infinity are not JSON a server reads)."""
    if not text:
        return None

    def refuse(constant):
        raise ValueError(f"{constant} is not a JSON value")

    try:
        kwargs = json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError) as exc:
        raise TrainerInputError(f"--chat-template-kwargs is not JSON ({exc}); e.g. {EXAMPLE}") from None
    if not isinstance(kwargs, dict):
        raise TrainerInputError(f"--chat-template-kwargs must be a JSON object, e.g. {EXAMPLE}")
    return kwargs
