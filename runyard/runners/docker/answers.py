"""One HTTP/1.1 request to the engine over a socket of its own, and its answer read with
httptools' parser (llhttp, the parser the API's server uses): the head, then the body as
it arrives, chunked or not.

The standard library's client parses every answer's head with the ``email`` package, about
half of the worker's CPU per engine request; llhttp does it in C. What the standard library
bounded stays bounded here: an answer's head is at most ``MAX_HEAD_BYTES`` and
``MAX_HEADERS`` fields, and an answer that ends before its body does is an error, never a
short body.
"""

from __future__ import annotations

import socket

import httptools

MAX_HEAD_BYTES = 64 << 10
MAX_HEADERS = 100
_RECEIVE_BYTES = 64 << 10


class AnswerBroken(ConnectionError):
    """The engine's answer is not HTTP/1.1 we can read, too big a head, or cut short."""


def send_request(sock: socket.socket, method: str, target: str, body: bytes | None = None) -> None:
    """Write one request (``target``: its path and query, already quoted)."""
    if not target.isprintable() or " " in target or not method.isalpha():
        raise ValueError(f"not a request line: {method!r} {target!r}")
    lines = [f"{method} {target} HTTP/1.1", "Host: localhost", "Accept-Encoding: identity"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    sock.sendall(head if body is None else head + body)


class SocketAnswer:
    """The answer to the request just sent on ``sock``: ``read_head`` first, then ``read``."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._parser = httptools.HttpResponseParser(self)
        self._reason = bytearray()
        self._headers = 0
        self._head_bytes = 0
        self._fields_bytes = 0
        self._sized = False  # a length or chunks say where the body ends, not the close
        self._body = bytearray()
        self.headed = False
        self.complete = False
        self.status = 0

    @property
    def reason(self) -> str:
        """The status line's reason phrase."""
        return self._reason.decode("latin-1")

    def read_head(self) -> None:
        """Read until the head is parsed: ``status`` and ``reason`` are known."""
        while not self.headed:
            self._receive()

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body (b"" at its end)."""
        while len(self._body) < size and not self.complete:
            self._receive()
        piece = bytes(self._body[:size])
        del self._body[:size]
        return piece

    def _receive(self) -> None:
        data = self._sock.recv(_RECEIVE_BYTES)
        if not data:
            if self.headed and not self._sized:
                self.complete = True  # an answer whose body ends with the connection
                return
            raise AnswerBroken("the engine closed the connection before its answer ended")
        if not self.headed:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, AnswerBroken):  # raised by a callback of ours
                raise exc.__context__ from None
            raise AnswerBroken(f"the engine's answer is not HTTP/1.1: {exc}") from exc
        if not self.headed and self._head_bytes >= MAX_HEAD_BYTES:
            raise _head_too_big()

    # --- the parser's callbacks ---

    def on_status(self, reason: bytes) -> None:
        """A piece of the reason phrase."""
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header field."""
        self._headers += 1
        if self._headers > MAX_HEADERS:
            raise AnswerBroken(f"the engine's answer has over {MAX_HEADERS} header fields")
        # Bytes received count a head that never ends; its fields count one that does.
        self._fields_bytes += len(name) + len(value) + 4
        if self._fields_bytes > MAX_HEAD_BYTES:
            raise _head_too_big()
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._sized = True

    def on_headers_complete(self) -> None:
        """The head is read."""
        self.headed = True
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        """A piece of the body, its chunk framing removed."""
        self._body += body

    def on_message_complete(self) -> None:
        """The body is read."""
        self.complete = True


def _head_too_big() -> AnswerBroken:
    return AnswerBroken(f"the engine's answer has a head over {MAX_HEAD_BYTES} bytes")
