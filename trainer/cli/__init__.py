"""`python -m trainer COMMAND`: one module per command, each with NAME, `add_parser(sub)` and `run(args)`.

A command imports the torch-heavy parts it runs inside `run`: `--help`, `describe` and a refused flag answer without
importing the model, the loop or the data code. May import every other trainer package; nothing imports it but
trainer/__main__.py."""

from trainer.cli import (cmd_chat_turns, cmd_convert_gguf, cmd_describe, cmd_eval, cmd_evaluate, cmd_export, cmd_load_cache,
                         cmd_make_target, cmd_prepare, cmd_selftest, cmd_train, cmd_warmup)

# The order of `python -m trainer --help`.
COMMANDS = (cmd_train, cmd_warmup, cmd_describe, cmd_prepare, cmd_load_cache, cmd_selftest, cmd_make_target,
            cmd_convert_gguf, cmd_chat_turns, cmd_eval, cmd_evaluate, cmd_export)
