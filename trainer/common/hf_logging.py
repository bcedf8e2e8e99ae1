"""transformers' own output kept out of run logs."""

from __future__ import annotations


def quiet_transformers() -> None:
    """No progress bars from transformers: they write carriage returns into run logs and the terminal."""
    from transformers.utils import logging as hf_logging  # here, not above: common/ stays importable without torch

    hf_logging.disable_progress_bar()
