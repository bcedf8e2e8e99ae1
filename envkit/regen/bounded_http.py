"""HTTP/1.1 to a serving engine, with the bounds a peer cannot stretch: one deadline per request that holds however
slowly the peer sends (each read waits only for what is left of it; a per-read timeout, httpx's, lets a peer that
trickles a byte a second hold a request forever), a cap on the size of every reply (compressed or not), and
nothing followed (no redirects, no proxy settings from the environment).

Keep-alive connections, one per worker thread; Content-Length, chunked and read-to-close bodies; gzip and deflate
bodies decoded within the cap. Stdlib only: the client must keep several engines busy on two cores.
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
import zlib
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

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
    """One keep-alive connection to an endpoint, used by one thread at a time."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float):
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.sock: socket.socket | None = None
        self.buffer = bytearray()

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self.buffer.clear()

    def request(self, method: str, path: str, body: bytes | None, *, deadline: float, limit: int) -> Response:
        """Send one request and read its whole reply by `deadline` (time.monotonic()), the body at most `limit`
        bytes; a kept connection the server closed while idle is opened again once."""
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
        if self.sock is None:
            self._connect(deadline)
        endpoint = self.endpoint
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        lines = [f"{method} {endpoint.path}{path} HTTP/1.1", f"Host: {host}:{endpoint.port}",
                 "Accept: application/json", "Accept-Encoding: gzip, deflate", "User-Agent: envkit-regenerate"]
        if endpoint.authorization:
            lines.append(f"Authorization: {endpoint.authorization}")
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
        try:
            self._settimeout(deadline)
            self.sock.sendall(head + (body or b""))
        except socket.timeout:
            raise HttpError("deadline", "the server took no request before the deadline") from None
        except OSError as exc:
            raise HttpError("stale", f"the connection broke while sending ({exc.strerror or exc})") from None
        status, headers = self._read_head(deadline)
        while 100 <= status < 200:  # an interim reply (100 Continue): the real one follows
            status, headers = self._read_head(deadline)
        if method == "HEAD" or status in (204, 304):
            payload = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            payload = self._read_chunked(deadline, limit)
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit() or not length.isascii():
                raise HttpError("protocol", f"a Content-Length of {length[:40]!r}")
            if int(length) > limit:
                raise HttpError("too_large", f"a reply of {int(length):,} bytes (at most {limit:,} are read)")
            payload = self._read_exactly(int(length), deadline)
        else:
            payload = self._read_to_close(deadline, limit)
            headers["connection"] = "close"
        payload = _decoded(payload, headers.get("content-encoding", "").strip().lower(), limit)
        if "close" in headers.get("connection", "").lower():
            self.close()
        return Response(status, headers, payload)

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
        self.sock, self.buffer = sock, bytearray()

    def _settimeout(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HttpError("deadline", "no complete reply before the deadline")
        self.sock.settimeout(remaining)

    def _fill(self, deadline: float, *, eof_ok: bool = False) -> bool:
        """Read what the peer sends next into the buffer; False at a clean end of stream (where `eof_ok`)."""
        self._settimeout(deadline)
        try:
            data = self.sock.recv(READ_SIZE)
        except socket.timeout:
            raise HttpError("deadline", "no complete reply before the deadline") from None
        except OSError as exc:
            raise HttpError("connect", f"the connection broke ({exc.strerror or exc})") from None
        if not data:
            if eof_ok:
                return False
            raise HttpError("connect", "the server closed the connection mid-reply")
        self.buffer += data
        return True

    def _read_head(self, deadline: float) -> tuple[int, dict[str, str]]:
        started_empty = not self.buffer
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > HEAD_LIMIT:
                raise HttpError("too_large", f"reply headers over {HEAD_LIMIT >> 10} KiB")
            if not self._fill(deadline, eof_ok=True):
                kind = "stale" if started_empty and not self.buffer else "connect"
                raise HttpError(kind, "the server closed the connection without a reply")
        head = bytes(self.buffer[:end]).decode("latin-1")
        del self.buffer[:end + 4]
        status_line, *header_lines = head.split("\r\n")
        fields = status_line.split(" ", 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not (fields[1].isdigit() and len(fields[1]) == 3):
            raise HttpError("protocol", f"not an HTTP reply ({status_line[:60]!r})")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                key = name.strip().lower()
                headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        return int(fields[1]), headers

    def _read_exactly(self, length: int, deadline: float) -> bytes:
        while len(self.buffer) < length:
            self._fill(deadline)
        data = bytes(self.buffer[:length])
        del self.buffer[:length]
        return data

    def _read_line(self, deadline: float) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > HEAD_LIMIT:
                raise HttpError("protocol", "a chunk header over 64 KiB")
            self._fill(deadline)
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 2]
        return line

    def _read_chunked(self, deadline: float, limit: int) -> bytes:
        parts, total = [], 0
        while True:
            size_text = self._read_line(deadline).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError("protocol", f"a chunk size of {size_text[:20]!r}") from None
            if size == 0:
                while self._read_line(deadline):  # trailers, up to the blank line
                    pass
                return b"".join(parts)
            total += size
            if total > limit:
                raise HttpError("too_large", f"a reply over {limit:,} bytes (at most that many are read)")
            parts.append(self._read_exactly(size, deadline))
            if self._read_exactly(2, deadline) != b"\r\n":
                raise HttpError("protocol", "a chunk not followed by CRLF")

    def _read_to_close(self, deadline: float, limit: int) -> bytes:
        while self._fill(deadline, eof_ok=True):
            if len(self.buffer) > limit:
                raise HttpError("too_large", f"a reply over {limit:,} bytes (at most that many are read)")
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


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
