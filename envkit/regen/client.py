"""OpenAI's HTTP API as every serving engine speaks it (SGLang, vLLM, `transformers serve`): the model list, chat
completions and completions, with retries where a retry can help.

A reply is data: only the fields read here are used, each checked for its type; nothing in it is followed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from envkit.errors import EnvkitError
from envkit.support.text import printable

RETRY_STATUSES = {429, 500, 502, 503, 504}
RETRY_ERRORS = (httpx.TransportError,)  # connection refused or reset, timeouts, a dropped connection


class ServerError(EnvkitError):
    """A server that does not answer, or answers with something other than what was asked."""


class RowRefused(EnvkitError):
    """The server answered this row with an error a retry will not change (a 4xx other than 429)."""


@dataclass(frozen=True)
class Reply:
    text: str
    tokens: int | None  # generated tokens, as the server counts them (usage.completion_tokens)
    finish_reason: str | None


def _short(text: str, limit: int = 200) -> str:
    return printable(text.strip().replace("\n", " ")[:limit])


def list_models(client: httpx.Client, url: str) -> list[str]:
    reply = client.get(f"{url}/v1/models")
    reply.raise_for_status()
    data = reply.json().get("data")
    if not isinstance(data, list):
        raise ValueError("no `data` list")
    return [str(entry["id"]) for entry in data if isinstance(entry, dict) and "id" in entry]


def wait_for_models(client: httpx.Client, url: str, timeout: float) -> list[str]:
    """The models a server lists, waiting up to `timeout` for it to answer at all."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return list_models(client, url)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            if time.monotonic() >= deadline:
                raise ServerError(f"no answer from {url}/v1/models within {timeout:.0f}s ({_short(str(exc)) or type(exc).__name__}); "
                                  f"is the server up? (`envkit serve --venv SERVE_VENV --model DIR --detach`)") from None
            time.sleep(0.5)


def engine_version(client: httpx.Client, url: str) -> dict:
    """What the server says it is: vLLM's /version, SGLang's /get_server_info; others say nothing (None)."""
    for path in ("/version", "/get_server_info"):
        try:
            reply = client.get(f"{url}{path}", timeout=5)
            body = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            continue
        if isinstance(body, dict) and isinstance(body.get("version"), str):
            return {"engine": "vllm" if path == "/version" else "sglang", "version": body["version"][:64]}
    return {"engine": None, "version": None}  # transformers serve reports no version


def generate(client: httpx.Client, url: str, endpoint: str, body: dict, *, retries: int, backoff_s: float) -> Reply:
    """POST one request; 429, 5xx and dropped connections are retried with exponential backoff, other errors are
    the row's (RowRefused), and a server gone for good is a ServerError."""
    for attempt in range(retries + 1):
        try:
            reply = client.post(f"{url}/v1/{endpoint}", json=body)
        except RETRY_ERRORS as exc:
            problem = f"{type(exc).__name__}: {_short(str(exc))}"
        else:
            if reply.status_code == 200:
                return _parse(reply, endpoint, url)
            if reply.status_code not in RETRY_STATUSES:
                raise RowRefused(f"{reply.status_code} from {url}: {_short(reply.text)}")
            problem = f"{reply.status_code}: {_short(reply.text)}"
        if attempt < retries:
            time.sleep(min(backoff_s * 2 ** attempt, 10.0))
    raise ServerError(f"{url} failed {retries + 1} times ({problem})")


def _parse(reply: httpx.Response, endpoint: str, url: str) -> Reply:
    try:
        body = reply.json()
        choice = body["choices"][0]
        text = choice["message"]["content"] if endpoint == "chat/completions" else choice["text"]
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    except (ValueError, KeyError, IndexError, TypeError):
        raise ServerError(f"{url} answered /v1/{endpoint} with no choices[0] text: {_short(reply.text)}") from None
    if not isinstance(text, str):
        raise ServerError(f"{url} answered /v1/{endpoint} with a {type(text).__name__} where text belongs")
    tokens = usage.get("completion_tokens")
    finish = choice.get("finish_reason")
    return Reply(text, tokens if isinstance(tokens, int) else None, finish if isinstance(finish, str) else None)
