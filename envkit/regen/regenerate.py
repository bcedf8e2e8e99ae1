"""`envkit data regenerate`'s entry: the servers asked which model they serve, the manifest's facts gathered, then a
fresh or resumed run (job.py) or a retry of the rows set aside (retry.py)."""

from __future__ import annotations

from envkit import __version__
from envkit.errors import RegenError
from envkit.regen import openai_api
from envkit.regen.bounded_http import parse_endpoint
from envkit.regen.job import Run
from envkit.regen.ledger import MANIFEST_FORMAT, Ledger
from envkit.regen.prompts import PromptFile
from envkit.regen.request import RegenRequest, RegenResult, check_request
from envkit.regen.retry import retry_failed
from envkit.support.text import printable


def connect(request) -> list[openai_api.Server]:
    """The request's --server URLs as servers (regenerate's and synthesize's): a bad URL is one line."""
    try:
        endpoints = [parse_endpoint(server) for server in request.servers]
    except ValueError as exc:
        raise RegenError(f"--server: {exc}") from None
    return [openai_api.Server(endpoint, min(10.0, request.connect_timeout_s) or 10.0) for endpoint in endpoints]


def regenerate(request: RegenRequest) -> RegenResult:
    """Answer every prompt row of `request.prompts` into `request.out` (see the module docstring)."""
    check_request(request)
    servers = connect(request)
    with PromptFile(request.prompts) as prompts:
        listed = {server.url: server.models(request.connect_timeout_s) for server in servers}
        model = choose_model(listed, request.model)
        manifest = {"format": MANIFEST_FORMAT, "prompts": str(request.prompts.absolute()), "prompts_sha256": prompts.sha256,
                    "prompts_rows": prompts.rows, "prompts_lines": prompts.lines, "model": model,
                    "settings": {"max_tokens": request.max_tokens, "temperature": request.temperature,
                                 "chat_template_kwargs": request.chat_template_kwargs, "turns": request.turns},
                    "servers": [server.url for server in servers],
                    "engines": {server.url: server.engine() for server in servers}, "envkit": __version__}
        if request.retry_failed:
            return retry_failed(request, servers, prompts, manifest)
        ledger = Ledger(request.out, manifest, request.resume)
        try:
            result = Run(request, servers, prompts, ledger, model).go()
        finally:
            ledger.close()
    if result.rows == 0 and result.failed:
        raise RegenError(f"every row was set aside ({result.failed:,}; the reasons are in {result.errors}): nothing to "
                         f"train on; fix what they name, then `--retry-failed`")
    return result


def choose_model(listed: dict[str, list[str]], wanted: str | None) -> str:
    for url, models in listed.items():
        if wanted is not None and wanted not in models:
            raise RegenError(f"{url} serves {printable(models[:8])}, not {printable(wanted)!r}; give --model one of them")
    if wanted is not None:
        return wanted
    common = sorted(set.intersection(*(set(models) for models in listed.values())))
    if len(common) != 1:
        raise RegenError(f"the servers serve {printable(common[:8]) or 'no common model'}; give --model ID")
    return common[0]
