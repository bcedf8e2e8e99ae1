"""`python -m trainer chat-turns`: a tokenizer's chat template cut around each turn (JSON), for `envkit data
synthesize` to prompt the target the way its own template does (trainer/data/chat_turns.py)."""

from __future__ import annotations

import json

from trainer.common.template_kwargs import parse_template_kwargs

NAME = "chat-turns"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="the chat template's text before a user message, between turns, and the text that "
                                  "ends a user turn (JSON)")
    p.add_argument("--tokenizer", required=True, help="the target's model dir, or its tokenizer's")
    p.add_argument("--chat-template-kwargs", metavar="JSON", help='e.g. \'{"enable_thinking": false}\'')


def run(args) -> int:
    from trainer.data.chat_turns import chat_turns

    print(json.dumps(chat_turns(args.tokenizer, parse_template_kwargs(args.chat_template_kwargs))))
    return 0
