"""OpenAI's HTTP API as every serving engine speaks it (SGLang, vLLM, `transformers serve`): the model list, what
the engine says it is, chat completions and completions, with retries where a retry can help.

A reply is data: parsed with bounded depth, only the fields read here are used, each checked for its type, and
what it claims (its length) against what was asked; nothing in it is followed.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from envkit.errors import EnvkitError
from envkit.regen.bounded_http import Connection, Endpoint, HttpError
from envkit.support.text import printable
from envkit.support.trainer_helpers import loads_exchanged_json

RETRY_STATUSES = {429, 500, 502, 503, 504}
INFO_LIMIT = 1 << 20  # /v1/models, /version: kilobytes
REPLY_LIMIT = 32 << 20  # a completion with its usage: kilobytes, or megabytes with logprobs
PROBE_S = 5.0  # one try of /v1/models or /version


class ServerError(EnvkitError):
    """A server that does not answer (refused, reset, silent past its deadline): the server's fault, not a row's."""


class RowFailed(EnvkitError):
    """This row got no usable answer (a 4xx, a reply that is not a completion, a 5xx after the retries):
    the row is set aside, the server goes on."""


@dataclass(frozen=True)
class Reply:
    text: str
    tokens: int | None  # generated tokens, as the server counts them (usage.completion_tokens)
    finish_reason: str | None


def short(text: object, limit: int = 200) -> str:
    return printable(str(text).strip().replace("\n", " ")[:limit])


class Server:
    """One engine's API; each thread talks to it over a keep-alive connection of its own."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float = 10.0):
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self._local = threading.local()

    @property
    def url(self) -> str:
        return self.endpoint.shown

    def _connection(self) -> Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = Connection(self.endpoint, self.connect_timeout)
        return connection

    def call(self, method: str, path: str, payload: dict | None, *, deadline: float, limit: int):
        """(status, parsed JSON body or None when it is not JSON, raw body); the headers of the last reply are kept
        for the caller that asks (`retry_after`)."""
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode() if payload is not None else None
        response = self._connection().request(method, path, body, deadline=deadline, limit=limit)
        self._local.headers = response.headers
        try:
            parsed = loads_exchanged_json(response.body)
        except ValueError:  # not JSON, not UTF-8, nested past the parser's depth
            parsed = None
        return response.status, parsed, response.body

    def retry_after(self) -> float | None:
        """The last reply's Retry-After in seconds (a number of seconds; an HTTP date is not waited for), or None."""
        value = (getattr(self._local, "headers", None) or {}).get("retry-after", "").strip()
        return float(value) if value.isdigit() else None

    def alive(self) -> bool:
        """Whether the server answers its model list now (one short try): the evidence that a request it dropped
        was that row's doing, not a dead server's."""
        try:
            status, body, _ = self.call("GET", "/v1/models", None, deadline=time.monotonic() + PROBE_S,
                                        limit=INFO_LIMIT)
        except HttpError:
            return False
        return status == 200 and isinstance(body, dict)

    # -- what the server is ----------------------------------------------------------------------------------
    def models(self, timeout: float) -> list[str]:
        """The model ids /v1/models lists, waiting up to `timeout` seconds in all for it to answer at all."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, body, raw = self.call("GET", "/v1/models", None, limit=INFO_LIMIT,
                                              deadline=min(deadline, time.monotonic() + PROBE_S))
                data = body.get("data") if isinstance(body, dict) and status == 200 else None
                if isinstance(data, list):
                    return [entry["id"] for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
                problem = f"HTTP {status}: {short(raw.decode(errors='replace'))}" if status != 200 else "no `data` list"
            except HttpError as exc:
                problem = str(exc)
            if time.monotonic() >= deadline:
                raise ServerError(f"no model list from {self.url}/v1/models within {timeout:.0f}s ({problem}); is the "
                                  f"server up? (`envkit serve --venv SERVE_VENV --model DIR --detach`)")
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def engine(self) -> dict:
        """What the server says it is: vLLM's /version, SGLang's /get_server_info; others say nothing (None)."""
        for path, name in (("/version", "vllm"), ("/get_server_info", "sglang")):
            try:
                status, body, _ = self.call("GET", path, None, deadline=time.monotonic() + PROBE_S, limit=INFO_LIMIT)
            except HttpError:
                continue
            if status == 200 and isinstance(body, dict) and isinstance(body.get("version"), str):
                return {"engine": name, "version": printable(body["version"][:64])}
        return {"engine": None, "version": None}  # transformers serve reports no version

    # -- generation -------------------------------------------------------------------------------------------
    def generate(self, endpoint: str, body: dict, *, max_tokens: int, retries: int, backoff_s: float,
                 timeout_s: float) -> Reply:
        """POST one request; 429, 5xx and a dropped connection are retried with exponential backoff. A server that
        stays unreachable is a ServerError; a row the server will not answer (or answers with no completion) is
        RowFailed. Each try has `timeout_s` in all, however slowly the reply comes."""
        problem, wait_s = "", None
        started = time.monotonic()
        for attempt in range(retries + 1):
            if attempt:
                # A 429/503's Retry-After is the server's word, honoured while the row has time left; else backoff.
                pause = min(backoff_s * 2 ** (attempt - 1), 10.0) if wait_s is None else wait_s
                time.sleep(max(0.0, min(pause, started + timeout_s - time.monotonic())))
                wait_s = None
            try:
                status, parsed, raw = self.call("POST", f"/v1/{endpoint}", body, limit=REPLY_LIMIT,
                                                deadline=time.monotonic() + timeout_s)
            except HttpError as exc:
                if exc.kind in ("deadline", "too_large", "protocol"):  # the same request would do it again
                    raise RowFailed(f"{exc} from {self.url}") from None
                problem = str(exc)
                continue
            if status == 200:
                return _completion(parsed, raw, endpoint, max_tokens, self.url)
            text = short(raw.decode(errors="replace"))
            if status not in RETRY_STATUSES:
                raise RowFailed(f"HTTP {status} from {self.url}: {text}")
            problem = f"HTTP {status}: {text}"
            wait_s = self.retry_after() if status in (429, 503) else None
            if attempt == retries:
                raise RowFailed(f"{self.url} answered {retries + 1} times with {problem}")
        raise ServerError(f"{self.url} failed {retries + 1} times ({problem})")


def _completion(body, raw: bytes, endpoint: str, max_tokens: int, url: str) -> Reply:
    """A 200 reply's text, checked: a string of UTF-8 text, no longer than was asked for where the server counts."""
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] if endpoint == "chat/completions" else choice["text"]
    except (KeyError, IndexError, TypeError):
        raise RowFailed(f"{url} answered /v1/{endpoint} with no choices[0] text: "
                        f"{short(raw.decode(errors='replace'))}") from None
    if not isinstance(text, str):
        raise RowFailed(f"{url} answered /v1/{endpoint} with a {type(text).__name__} where text belongs")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RowFailed(f"{url} answered with a lone surrogate in the text (not UTF-8 text)") from None
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens")
    tokens = tokens if type(tokens) is int and tokens >= 0 else None
    if tokens is not None and tokens > max_tokens:
        raise RowFailed(f"{url} reports {tokens} generated tokens for max_tokens {max_tokens}: it did not generate "
                        f"with the settings asked for")
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    return Reply(text, tokens, printable(finish[:32]) if isinstance(finish, str) else None)
