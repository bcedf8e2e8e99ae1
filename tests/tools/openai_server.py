"""A small OpenAI-compatible server of the tests' own (and bench/regenerate.py's instant server): answers at once,
deterministically from what it was sent, and misbehaves on purpose where a test asks it to.

    python tests/tools/openai_server.py --port 0 --port-file F [--model ID] [--refuse TEXT] [--fail TEXT]
        [--delay S] [--version V] [--die-after N] [--hostile KIND] [--drop TEXT] [--busy N --retry-after S]

The answer to a request is `answer-<sha256 of the request's messages or prompt (and seed), 12 hex>`: a multi-turn answer depends on every earlier turn sent with it. --refuse TEXT: a 400 for a
request that holds TEXT; --fail TEXT: a 500 for it; --drop TEXT: its connection closed unanswered; --busy N:
the first N generation requests a 429 with Retry-After S. --hostile KIND makes every reply (models, generation or both)
one attack: trickle-models, trickle-version, endless, bad-gzip, deep, surrogate, overlong, nan,
negative-chunk, surplus.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import zlib

ARGS = argparse.Namespace()
SERVED = {"completions": 0}


def answer_text(payload: dict) -> str:
    asked = payload.get("messages", payload.get("prompt"))
    if "seed" in payload:  # a sampled request: another seed, another answer (synthesis's attempts)
        asked = [asked, payload["seed"]]
    digest = hashlib.sha256(json.dumps(asked, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]
    return f" answer-{digest}"


def reply(status: int, body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def completion(path: str, payload: dict) -> bytes:
    text = answer_text(payload)
    usage = {"completion_tokens": 4096 if ARGS.hostile == "overlong" else len(text.split())}
    if path.endswith("chat/completions"):
        choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    else:
        choice = {"text": text, "finish_reason": "stop"}
    return json.dumps({"choices": [choice], "usage": usage, "model": ARGS.model}).encode()


async def trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
    for byte in data:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(1.0)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            await respond(method, path, body, writer)
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def respond(method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
    hostile = ARGS.hostile
    if path.endswith("/v1/models"):
        data = json.dumps({"object": "list", "data": [{"id": ARGS.model, "object": "model"}]}).encode()
        if hostile == "trickle-models":
            return await trickle(writer, reply(200, data))
        writer.write(reply(200, data))
    elif path.endswith("/version"):
        if ARGS.version is None and hostile != "trickle-version":
            writer.write(reply(404, b'{"detail": "Not Found"}'))
        elif hostile == "trickle-version":
            return await trickle(writer, reply(200, b'{"version": "1.0"}'))
        else:
            writer.write(reply(200, json.dumps({"version": ARGS.version}).encode()))
    elif path.endswith("completions") and method == "POST":
        payload = json.loads(body)
        asked = json.dumps(payload.get("messages", payload.get("prompt")), ensure_ascii=False)
        if ARGS.delay:
            await asyncio.sleep(ARGS.delay)
        if ARGS.drop and ARGS.drop in asked:  # the connection closed, no reply: a row the server chokes on
            writer.close()
            return
        if ARGS.busy > 0:  # a 429 with Retry-After for the first requests, then answers
            ARGS.busy -= 1
            writer.write(reply(429, b'{"error": "busy"}', f"Retry-After: {ARGS.retry_after}\r\n"))
        elif ARGS.refuse and ARGS.refuse in asked:
            writer.write(reply(400, b'{"error": {"message": "This model\'s maximum context length is exceeded"}}'))
        elif ARGS.fail and ARGS.fail in asked:
            writer.write(reply(500, b'{"error": "internal"}'))
        elif hostile == "endless":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"a" * 65536
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
        elif hostile == "bad-gzip":
            writer.write(reply(200, b"\x1f\x8b\x08\x00garbage-not-gzip", "Content-Encoding: gzip\r\n"))
        elif hostile == "deep":
            writer.write(reply(200, b"[" * 200_000 + b"]" * 200_000))
        elif hostile == "negative-chunk":  # a chunk size with a sign: int(x, 16) reads it, HTTP does not
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"-7fffffff\r\n")
        elif hostile == "surplus":  # a whole reply and, in the same write, bytes that look like the next one
            writer.write(reply(200, completion(path, payload)) + reply(200, completion(path, {"prompt": "INJECTED"})))
        elif hostile == "nan":  # a number JSON has no word for: the reply is not JSON
            writer.write(reply(200, b'{"choices": [{"text": "x", "message": {"content": "x"}}], '
                                    b'"usage": {"completion_tokens": NaN}}'))
        elif hostile == "surrogate":
            writer.write(reply(200, b'{"choices": [{"text": "a\\ud800b", "message": {"content": "a\\ud800b"}}]}'))
        elif hostile == "gzip":  # a well-formed compressed reply: decoded
            packer = zlib.compressobj(wbits=31)
            data = packer.compress(completion(path, payload)) + packer.flush()
            writer.write(reply(200, data, "Content-Encoding: gzip\r\n"))
        else:
            writer.write(reply(200, completion(path, payload)))
        SERVED["completions"] += 1
        if ARGS.die_after and SERVED["completions"] >= ARGS.die_after:
            await writer.drain()
            os._exit(0)
    else:
        writer.write(reply(404, b'{"detail": "Not Found"}'))
    await writer.drain()


async def main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", ARGS.port, limit=1 << 26)
    port = server.sockets[0].getsockname()[1]
    if ARGS.port_file:
        tmp = ARGS.port_file + ".tmp"
        with open(tmp, "w") as handle_:
            handle_.write(str(port))
        os.replace(tmp, ARGS.port_file)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--model", default="test/model")
    parser.add_argument("--refuse")
    parser.add_argument("--fail")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--version")
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--hostile")
    parser.add_argument("--drop")
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--retry-after", type=int, default=1)
    parser.parse_args(namespace=ARGS)
    asyncio.run(main())
