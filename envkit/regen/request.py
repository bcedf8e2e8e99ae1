"""What a regeneration is asked (`RegenRequest`, checked before anything is sent) and what it reports (`RegenResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from envkit.errors import RegenError
from envkit.regen.row_requests import TURNS
from envkit.support.text import printable


@dataclass(frozen=True)
class RegenRequest:
    servers: tuple[str, ...]
    prompts: Path
    out: Path
    model: str | None = None
    concurrency: int = 8  # per server
    max_tokens: int = 512
    temperature: float = 0.0
    chat_template_kwargs: dict | None = None
    resume: bool = False
    retries: int = 5
    backoff_s: float = 0.5
    connect_timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    turns: str = "all"
    max_failures: str | None = None  # "N" rows or "P%" of the prompt rows; None: no bound
    retry_failed: bool = False


@dataclass
class RegenResult:
    out: str
    manifest: str
    errors: str
    model: str
    rows: int  # rows in OUT (this run's and the runs' before it)
    failed: int  # rows in the errors file
    written_now: int
    failed_now: int
    resumed_from: int  # prompt lines settled before this run
    generated_tokens: int
    seconds: float
    rows_per_s: float
    tokens_per_s: float
    dead_servers: dict = field(default_factory=dict)


def check_request(request: RegenRequest) -> None:
    if not math.isfinite(request.temperature) or request.temperature < 0:
        raise RegenError(f"--temperature {request.temperature} is not a finite number >= 0")
    if request.turns not in TURNS:
        raise RegenError(f"--turns {printable(request.turns)!r}: give one of {', '.join(TURNS)}")
    failure_bound(request.max_failures, 1)
    if not request.prompts.is_file():
        raise RegenError(f"--data {request.prompts}: not a file")


def failure_bound(text: str | None, rows: int) -> int | None:
    """--max-failures as a count of rows: "N", or "P%" of the prompt rows; None for no bound."""
    if text is None:
        return None
    value = text.strip()
    try:
        number = float(value[:-1]) if value.endswith("%") else int(value)
    except ValueError:
        number = -1
    if not (isinstance(number, (int, float)) and math.isfinite(number) and number >= 0
            and (not value.endswith("%") or number <= 100)):
        raise RegenError(f"--max-failures {printable(text)!r}: give a row count (10) or a percentage (0.5%)")
    return int(rows * number / 100) if value.endswith("%") else int(number)
