"""The regenerate client's HTTP/1.1 framing against a peer that sends exactly the bytes a test gives it: replies
framed every way the grammar allows are read whole, and every way out of it is one HttpError, never a reply read
wrong (the hostile servers of test_regenerate.py run the same code through `envkit data regenerate`)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from envkit.regen.bounded_http import HEAD_LIMIT, Connection, HttpError, parse_endpoint

OK_BODY = b'{"ok": true}'


class RawPeer:
    """A listening socket that answers each request it reads with the next of `replies` (bytes), then leaves the
    connection open, or closes it where the reply is followed by None."""

    def __init__(self, replies: list[bytes | None]):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.replies = list(replies)
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while self.replies:
            conn, _ = self.listener.accept()
            self.connections += 1
            with conn:
                while self.replies:
                    if not conn.recv(65536):
                        break
                    reply = self.replies.pop(0)
                    conn.sendall(reply)
                    if self.replies and self.replies[0] is None:
                        self.replies.pop(0)
                        break


def post(connection: Connection, limit: int = 1 << 20):
    return connection.request("POST", "/v1/completions", b"{}", deadline=time.monotonic() + 5, limit=limit)


def reply(head: str, body: bytes = b"") -> bytes:
    return head.replace("\n", "\r\n").encode() + b"\r\n" + body


@pytest.mark.parametrize("raw", [
    reply(f"HTTP/1.1 200 OK\nContent-Length: {len(OK_BODY)}\n", OK_BODY),
    reply("HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n", b"5\r\n" + OK_BODY[:5] + b"\r\n7\r\n" + OK_BODY[5:]
          + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"),
    reply("HTTP/1.1 100 Continue\n") + reply(f"HTTP/1.1 200 OK\nContent-Length: {len(OK_BODY)}\n", OK_BODY),
], ids=["content-length", "chunked-with-trailer", "after-100-continue"])
def test_a_framed_reply_is_read_whole_and_the_connection_kept(raw):
    peer = RawPeer([raw, raw])
    connection = Connection(parse_endpoint(peer.url), 2)
    for _ in range(2):
        answer = post(connection)
        assert (answer.status, answer.body) == (200, OK_BODY)
    assert peer.connections == 1  # kept alive between the two


def test_a_body_that_ends_at_the_close_is_whole_and_the_connection_not_kept():
    peer = RawPeer([reply("HTTP/1.1 200 OK\nConnection: close\n", OK_BODY), None,
                    reply(f"HTTP/1.1 200 OK\nContent-Length: {len(OK_BODY)}\n", OK_BODY)])
    connection = Connection(parse_endpoint(peer.url), 2)
    assert post(connection).body == OK_BODY
    assert connection.sock is None
    assert post(connection).body == OK_BODY and peer.connections == 2


@pytest.mark.parametrize("raw, kind, words", [
    (reply("HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n", b"-7fffffff\r\nabc\r\n0\r\n\r\n"), "protocol",
     "chunk size"),
    (reply("HTTP/1.1 200 OK\nContent-Length: 3\nContent-Length: 4\n", b"abc"), "protocol", "Content-Length"),
    (reply("HTTP/1.1 200 OK\nContent-Length: +3\n", b"abc"), "protocol", "Content-Length"),
    (reply("HTTP/1.1 200 OK\nContent-Length: 3\nTransfer-Encoding: chunked\n", b"3\r\nabc\r\n0\r\n\r\n"),
     "protocol", "Transfer-Encoding"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "protocol", "not a well-formed"),
    (reply("HTTP/1.1 200 OK\nContent-Length: 99999999\n"), "too_large", "99,999,999 bytes"),
    (reply("HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n", b"fffff\r\n" + b"x" * 70000), "too_large", "over"),
    (reply("HTTP/1.1 200 OK\n" + "X-Pad: " + "p" * HEAD_LIMIT + "\n"), "protocol", "headers over"),
    (reply("HTTP/1.1 200 OK\nContent-Length: 10\n", b"abc") + b"", "connect", "mid-reply"),
], ids=["negative-chunk", "two-lengths", "signed-length", "length-and-chunked", "not-http", "declared-too-large",
        "chunks-too-large", "endless-head", "cut-short"])
def test_a_reply_outside_the_grammar_or_the_caps_is_one_error(raw, kind, words):
    peer = RawPeer([raw, None])
    with pytest.raises(HttpError) as caught:
        post(Connection(parse_endpoint(peer.url), 2), limit=65536)
    assert caught.value.kind == kind and words in str(caught.value)


def test_bytes_after_a_whole_reply_drop_the_connection():
    whole = reply(f"HTTP/1.1 200 OK\nContent-Length: {len(OK_BODY)}\n", OK_BODY)
    peer = RawPeer([whole + reply("HTTP/1.1 200 OK\nContent-Length: 8\n", b"INJECTED"), whole])
    connection = Connection(parse_endpoint(peer.url), 2)
    assert post(connection).body == OK_BODY and connection.sock is None
    assert post(connection).body == OK_BODY and peer.connections == 2
