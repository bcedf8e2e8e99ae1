"""A target's chat template cut around its turns (`python -m trainer chat-turns` in the training venv), for
`envkit data synthesize`: envkit renders no template itself, so the cut is the tokenizer's own rendering."""

from __future__ import annotations

import json

from envkit.errors import RegenError
from envkit.support.trainer_helpers import loads_json
from envkit.trainerproc.process import run_trainer, trainer_env
from envkit.venv.managed import Venv

PIECES = ("before_user", "user_to_assistant", "assistant_to_user", "user_stop", "template_sha256")


def chat_turns(venv: Venv, tokenizer: str, template_kwargs: dict | None) -> dict:
    args = ["chat-turns", "--tokenizer", tokenizer]
    if template_kwargs:
        args += ["--chat-template-kwargs", json.dumps(template_kwargs)]
    proc = run_trainer(venv, args, trainer_env(venv, None), error=RegenError, timeout=600)
    try:
        turns = loads_json(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RegenError(f"`python -m trainer chat-turns` in {venv.path} printed no result") from None
    if not (isinstance(turns, dict) and all(isinstance(turns.get(key), str) for key in PIECES)):
        raise RegenError(f"`python -m trainer chat-turns` in {venv.path} printed no template pieces")
    return turns
