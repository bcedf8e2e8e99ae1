"""HTTP/1.1 to a serving engine, with the bounds a peer cannot stretch: one deadline per request that holds however
slowly the peer sends (each read waits only for what is left of it; a per-read timeout, httpx's, lets a peer that
trickles a byte a second hold a request forever), a cap on the size of every reply (compressed or not), and
nothing followed (no redirects, no proxy settings from the environment).

Keep-alive connections, one per worker thread, framed by h11; gzip and deflate bodies decoded within the cap. No
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

import h11

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
    """One keep-alive connection to an endpoint, used by one thread at a time. The bytes are framed by h11 (the
    sans-IO HTTP/1.1 parser under httpcore and httpx): status line, headers, Content-Length, chunked bodies and
    trailers by the grammar, not by Python's conveniences (int(x, 16) takes a sign; a chunk size of -7fffffff would
    lower a running total). What is envkit's: the socket, the deadline, the caps."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float):
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.sock: socket.socket | None = None
        self.protocol: h11.Connection | None = None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = self.protocol = None

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
        status, headers, parts, total, received = None, {}, [], 0, False
        while True:
            try:
                event = self.protocol.next_event()
            except h11.RemoteProtocolError as exc:
                raise HttpError("protocol", f"not a well-formed HTTP/1.1 reply ({str(exc)[:120]})") from None
            if event is h11.NEED_DATA:
                data = self._recv(deadline)
                if not data and not received:
                    raise HttpError("stale", "the server closed the connection without a reply")
                received = True
                self.protocol.receive_data(data)
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, _headers(event.headers)
                length = headers.get("content-length", "")
                if length.isdigit() and int(length) > limit:
                    raise HttpError("too_large", f"a reply of {int(length):,} bytes (at most {limit:,} are read)")
            elif isinstance(event, h11.Data):
                total += len(event.data)
                if total > limit:
                    raise HttpError("too_large", f"a reply over {limit:,} bytes (at most that many are read)")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise HttpError("connect", "the server closed the connection mid-reply")
            # h11.InformationalResponse (100 Continue): the real reply follows
        payload = _decoded(b"".join(parts), headers.get("content-encoding", "").strip().lower(), limit)
        self._after_reply()
        return Response(status, headers, payload)

    def _request_bytes(self, method: str, path: str, body: bytes | None) -> bytes:
        """The request through h11's state machine (it must have sent one to read a reply). Its fields are envkit's
        own, checked once: the host and path by parse_endpoint, the rest constants; so h11 is told they are parsed
        (`_parsed`), which spares the per-request header validation that cost ~70 us a request (a third of the
        client's time at 1 M rows, bench/RESULTS.md)."""
        headers = list(self._headers)
        if body is not None:
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        request = h11.Request(method=method.encode(), target=f"{self.endpoint.path}{path}".encode("ascii"),
                              headers=headers, http_version=b"1.1", _parsed=True)
        data = self.protocol.send(request)
        if body:
            data += self.protocol.send(h11.Data(data=body))
        return data + self.protocol.send(h11.EndOfMessage())

    @functools.cached_property
    def _headers(self) -> list[tuple[bytes, bytes]]:
        endpoint = self.endpoint
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        headers = [("host", f"{host}:{endpoint.port}"), ("accept", "application/json"),
                   ("accept-encoding", "gzip, deflate"), ("user-agent", "envkit-regenerate")]
        if endpoint.authorization:
            headers.append(("authorization", endpoint.authorization))
        h11.Request(method="GET", target="/", headers=headers)  # validated once, as h11 would every time
        return [(name.encode("ascii"), value.encode("ascii")) for name, value in headers]

    def _after_reply(self) -> None:
        """Keep the connection for the next request only when both sides may, and it holds no unread bytes (bytes
        after a complete body are not the next reply: the connection is dropped)."""
        protocol = self.protocol
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            surplus, closed = protocol.trailing_data
            if not surplus and not closed:
                protocol.start_next_cycle()
                return
        self.close()

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
        self.protocol = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)

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


def _headers(pairs) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in pairs:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


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
