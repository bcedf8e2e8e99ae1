"""HTTP/1.1 to a serving engine, with the bounds a peer cannot stretch: one deadline per request that holds however
slowly the peer sends (each read waits only for what is left of it; a per-read timeout, httpx's, lets a peer that
trickles a byte a second hold a request forever), a cap on the size of every reply (compressed or not), and
nothing followed (no redirects, no proxy settings from the environment).

Keep-alive connections, one per worker thread, framed by llhttp (httptools); gzip and deflate bodies decoded within the cap. No
event loop and no connection pool: the client must keep several engines busy on two cores.
"""

from __future__ import annotations

import base64
import functools
import select
import socket
import ssl
import time
import zlib
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import httptools

HEAD_LIMIT = 64 << 10  # status line and headers
READ_SIZE = 1 << 16


class HttpError(Exception):
    """A request that got no complete reply: `kind` is connect (refused, reset, closed), deadline, too_large or
    protocol (not HTTP, a bad chunk, a body that does not decode)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str  # the base path, without a trailing slash and without /v1
    authorization: str | None  # Basic credentials from the URL's user:password, sent, never shown
    shown: str  # the URL as it may be written down: no credentials

    def url(self, path: str) -> str:
        return f"{self.shown}{path}"


def parse_endpoint(text: str) -> Endpoint:
    """`http(s)://[user:pass@]host[:port][/base][/v1][/]`; ValueError (one line) for anything else."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
        host = parts.hostname
    except ValueError as exc:  # a bad IPv6 literal, a port that is not a number or out of range
        raise ValueError(f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not host or parts.query or parts.fragment:
        raise ValueError("not an http(s) URL of a server (e.g. http://127.0.0.1:8000)")
    if not host.isascii() or any(char in host for char in " \r\n\t/\\@"):
        raise ValueError("the host name holds characters no host has")
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    if not path.isascii() or not path.isprintable() or " " in path:
        raise ValueError("the path holds characters a request line cannot carry")
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(credentials).decode()
    port = port or (443 if parts.scheme == "https" else 80)
    shown_host = f"[{host}]" if ":" in host else host
    return Endpoint(parts.scheme, host, port, path, authorization, f"{parts.scheme}://{shown_host}:{port}{path}")


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class Connection:
    """One keep-alive connection to an endpoint, used by one thread at a time. Replies are framed by llhttp (Node's
    HTTP/1.1 parser, through httptools, as uvicorn reads requests): status line, headers, Content-Length, chunked
    bodies and trailers by the grammar, not by Python's conveniences (int(x, 16) takes a sign; a chunk size of
    -7fffffff would lower a running total). h11 framed them first and cost 60% of the client's time at 1 M rows
    (bench/RESULTS.md). What is envkit's: the socket, the deadline, the caps, a body that ends at the peer's close
    (llhttp leaves the end of the stream to its caller)."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float):
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.sock: socket.socket | None = None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None

    def request(self, method: str, path: str, body: bytes | None, *, deadline: float, limit: int) -> Response:
        """Send one request and read its whole reply by `deadline` (time.monotonic()), the body at most `limit`
        bytes; a kept connection the server closed or reset while idle is opened again once."""
        reused = self.sock is not None
        try:
            return self._exchange(method, path, body, deadline, limit)
        except HttpError as exc:
            self.close()
            if not (reused and exc.kind == "stale"):
                raise
        try:
            return self._exchange(method, path, body, deadline, limit)
        except HttpError:
            self.close()
            raise

    # -- the exchange ----------------------------------------------------------------------------------------
    def _exchange(self, method: str, path: str, body: bytes | None, deadline: float, limit: int) -> Response:
        if self.sock is not None and self._holds_unread():
            self.close()  # bytes nobody asked for (or the peer's close): never read as the next reply
        if self.sock is None:
            self._connect(deadline)
        self._send(self._request_bytes(method, path, body), deadline)
        reply = _Reply(limit)
        parser = reply.parser = httptools.HttpResponseParser(reply)
        received = False
        while not reply.complete:
            data = self._recv(deadline)
            if not data:
                if not received:
                    raise HttpError("stale", "the server closed the connection without a reply")
                if not reply.ends_at_close:
                    raise HttpError("connect", "the server closed the connection mid-reply")
                reply.complete, reply.keep_alive = True, False  # a body delimited by the close (RFC 9112 6.3)
                break
            received = True
            reply.fed += len(data)
            if not reply.head_done and reply.fed > HEAD_LIMIT:
                raise HttpError("protocol", f"a status line and headers over {HEAD_LIMIT:,} bytes")
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as exc:
                if reply.error is not None:
                    raise reply.error from None
                if not reply.complete:
                    raise HttpError("protocol", f"not a well-formed HTTP/1.1 reply ({str(exc)[:120]})") from None
                reply.keep_alive = False  # bytes after a complete body are not the next reply: drop the connection
        payload = _decoded(b"".join(reply.parts), reply.headers.get("content-encoding", "").strip().lower(), limit)
        if not reply.keep_alive:
            self.close()
        return Response(reply.status, reply.headers, payload)

    def _request_bytes(self, method: str, path: str, body: bytes | None) -> bytes:
        """The request line and headers: envkit's own fields, checked once (the host and path by parse_endpoint,
        the rest constants), so written out rather than passed through a validator on every request."""
        head = f"{method} {self.endpoint.path}{path} HTTP/1.1\r\n{self._head}"
        if body is None:
            return f"{head}\r\n".encode("ascii")
        return f"{head}content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode("ascii") + body

    @functools.cached_property
    def _head(self) -> str:
        endpoint = self.endpoint
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        headers = [("host", f"{host}:{endpoint.port}"), ("accept", "application/json"),
                   ("accept-encoding", "gzip, deflate"), ("user-agent", "envkit-regenerate")]
        if endpoint.authorization:
            headers.append(("authorization", endpoint.authorization))
        if any(not value.isascii() or not value.isprintable() for _, value in headers):
            raise HttpError("protocol", "a header value a request cannot carry")  # parse_endpoint rules this out
        return "".join(f"{name}: {value}\r\n" for name, value in headers)

    def _holds_unread(self) -> bool:
        """Whether an idle kept connection has anything to read: surplus bytes after the last reply, or its end."""
        pending = self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0
        return bool(pending) or bool(select.select([self.sock], [], [], 0)[0])

    def _connect(self, deadline: float) -> None:
        timeout = max(0.001, min(self.connect_timeout, deadline - time.monotonic()))
        try:
            sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.endpoint.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.endpoint.host)
        except socket.timeout:
            raise HttpError("connect", f"no connection within {timeout:.0f}s") from None
        except ssl.SSLError as exc:
            raise HttpError("connect", f"TLS failed ({exc.reason or exc})") from None
        except OSError as exc:
            raise HttpError("connect", f"cannot connect ({exc.strerror or exc})") from None
        self.sock = sock

    def _settimeout(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HttpError("deadline", "no complete reply before the deadline")
        self.sock.settimeout(remaining)

    def _send(self, data: bytes, deadline: float) -> None:
        try:
            self._settimeout(deadline)
            self.sock.sendall(data)
        except socket.timeout:
            raise HttpError("deadline", "the server took no request before the deadline") from None
        except OSError as exc:
            raise HttpError("stale", f"the connection broke while sending ({exc.strerror or exc})") from None

    def _recv(self, deadline: float) -> bytes:
        """What the peer sends next, waiting no longer than the deadline (b"": the end of the stream)."""
        self._settimeout(deadline)
        try:
            return self.sock.recv(READ_SIZE)
        except socket.timeout:
            raise HttpError("deadline", "no complete reply before the deadline") from None
        except ConnectionResetError:
            raise HttpError("stale", "the connection was reset") from None
        except OSError as exc:
            raise HttpError("connect", f"the connection broke ({exc.strerror or exc})") from None


class _Reply:
    """llhttp's callbacks for one reply: the status, headers and body within the caps. An informational reply
    (100 Continue) is passed over; a second reply in the same bytes is surplus, which ends the parse (the first
    stands, the connection is dropped). A callback's error stops llhttp and is raised by the exchange."""

    def __init__(self, limit: int):
        self.limit = limit
        self.status = 0
        self.headers: dict[str, str] = {}
        self.parts: list[bytes] = []
        self.total = self.fed = 0
        self.head_done = self.complete = self.keep_alive = self.ends_at_close = False
        self.error: HttpError | None = None
        self.parser: httptools.HttpResponseParser | None = None

    def on_message_begin(self) -> None:
        if self.complete:
            raise _Surplus()

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.limit:
            self.error = HttpError("too_large", f"a reply of {int(length):,} bytes (at most {self.limit:,} are read)")
            raise self.error
        self.status, self.keep_alive = self.parser.get_status_code(), self.parser.should_keep_alive()
        self.head_done = True
        self.ends_at_close = not length and "chunked" not in self.headers.get("transfer-encoding", "").lower()

    def on_body(self, data: bytes) -> None:
        self.total += len(data)
        if self.total > self.limit:
            self.error = HttpError("too_large", f"a reply over {self.limit:,} bytes (at most that many are read)")
            raise self.error
        self.parts.append(bytes(data))

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # the real reply follows
            self.headers, self.head_done = {}, False
            return
        self.complete = True


class _Surplus(Exception):
    """Bytes after a complete reply (raised inside llhttp's callback to stop it there)."""


def _decoded(payload: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent before compression, never more than `limit` bytes of it (a small gzip can be a bomb)."""
    if encoding in ("", "identity"):
        return payload
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise HttpError("protocol", f"a body in the {encoding[:30]!r} encoding, which was not asked for")
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 32 if encoding != "deflate" else zlib.MAX_WBITS)
    try:
        data = decoder.decompress(payload, limit + 1)
        if len(data) > limit or decoder.unconsumed_tail:
            raise HttpError("too_large", f"a {encoding} reply that decodes to over {limit:,} bytes")
        data += decoder.flush()
        if not decoder.eof:
            raise zlib.error("truncated")
    except zlib.error as exc:
        raise HttpError("protocol", f"a {encoding} body that does not decode ({exc})") from None
    return data
