"""HTTP/1.1 to the engine's socket: what is sent, answers read by length, in chunks or to
the end, and every answer that breaks the protocol refused."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runyard.runners.docker.engine_wire import MAX_HEADERS, Exchange, WireError


class CannedEngine:
    """Answers each connection with ``answer`` (bytes as they are), keeping what was sent."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.answer = b""
        self.received: list[bytes] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(4)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    piece = conn.recv(65536)
                    if not piece:
                        break
                    request += piece
                self.received.append(request)
                conn.sendall(self.answer)

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[CannedEngine]:
    with contextlib.closing(CannedEngine(tmp_path / "e.sock")) as canned:
        yield canned


def body_of(exchange: Exchange, piece: int = 5) -> bytes:
    data = b""
    while chunk := exchange.read(piece):
        data += chunk
    exchange.close()
    return data


def test_exchange__the_request_as_sent(engine: CannedEngine):
    engine.answer = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
    exchange = Exchange(engine.path, 5, "POST", "/v1.41/containers/create?name=x", b'{"a":1}')
    assert (exchange.status, exchange.reason, body_of(exchange)) == (201, "Created", b"{}")
    assert engine.received == [
        b"POST /v1.41/containers/create?name=x HTTP/1.1\r\nHost: localhost\r\n"
        b"Connection: close\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n"
        b'{"a":1}'
    ]


def test_exchange__a_post_without_a_body_says_so(engine: CannedEngine):
    engine.answer = b"HTTP/1.1 204 No Content\r\n\r\n"
    exchange = Exchange(engine.path, 5, "POST", "/start")
    assert (exchange.status, body_of(exchange)) == (204, b"")
    assert b"Content-Length: 0\r\n" in engine.received[0]


def test_exchange__chunks_joined_with_extensions_and_trailers(engine: CannedEngine):
    engine.answer = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n"
        b"4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    assert body_of(Exchange(engine.path, 5, "GET", "/logs"), piece=3) == b"abcdefg"


def test_exchange__without_a_length_the_body_runs_to_the_connections_end(engine: CannedEngine):
    engine.answer = b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 10_000
    assert body_of(Exchange(engine.path, 5, "GET", "/x"), piece=4096) == b"x" * 10_000


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0 hello\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"A: b\r\n" * (MAX_HEADERS + 1) + b"\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2",
        b"",
    ],
    ids=[
        "not-http",
        "short-code",
        "bad-header",
        "too-many-headers",
        "long-line",
        "bad-length",
        "no-end-of-head",
        "nothing",
    ],
)
def test_exchange__a_broken_head_is_refused(engine: CannedEngine, answer: bytes):
    engine.answer = answer
    with pytest.raises(WireError):
        Exchange(engine.path, 5, "GET", "/x")


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    ],
    ids=["length-past-the-end", "bad-chunk-size", "chunk-without-line-end", "chunk-cut-short"],
)
def test_exchange__a_broken_body_is_refused(engine: CannedEngine, answer: bytes):
    engine.answer = answer
    exchange = Exchange(engine.path, 5, "GET", "/x")
    try:
        with pytest.raises(WireError):
            body_of(exchange)
    finally:
        exchange.close()


def test_exchange__no_socket_is_an_os_error(tmp_path: Path):
    with pytest.raises(OSError):
        Exchange(str(tmp_path / "none.sock"), 1, "GET", "/_ping")
