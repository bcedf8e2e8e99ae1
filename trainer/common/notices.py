"""Third-party notices that tell a run's reader nothing to act on, filtered at their source (one logger or warning
text each), never by silencing a library or a category: every other warning still reaches the log, and a test
fails on any the tiny run prints (tests/trainer/test_transformers_range.py)."""

from __future__ import annotations

import logging
import warnings

# torchao, at import, when its C++ extensions were built for another torch: its float8 training is Python and
# Triton and does not use them. torchao logs it on its own logger, or with logging.warning() in some versions.
TORCHAO_CPP_NOTICE = "Skipping import of cpp extensions"
# torchao's own sources, compiled at first import where an install wrote no bytecode: an escape in a docstring
# (quant_api.py: "invalid escape sequence '\\.'") is torchao's to fix and changes nothing at run time.
TORCHAO_SOURCE = r".*[/\\]torchao[/\\].*"


class _DropStartingWith(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def filter_known_notices() -> None:
    """Install the filters once per process, before anything imports the libraries that print them."""
    for logger in (logging.getLogger("torchao"), logging.getLogger()):
        if not any(isinstance(f, _DropStartingWith) for f in logger.filters):
            logger.addFilter(_DropStartingWith(TORCHAO_CPP_NOTICE))
    warnings.filterwarnings("ignore", message=TORCHAO_CPP_NOTICE)
    warnings.filterwarnings("ignore", category=SyntaxWarning, module=TORCHAO_SOURCE)
