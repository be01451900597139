"""HTTP/1.1 to the engine's unix socket, written out: one request per connection.

``http.client`` parses every answer's headers with the ``email`` package, which costs more
CPU than the rest of an engine request together. The engine's answers need three things
read: the status, and whether the body has a length or comes in chunks. So the request is
written and the answer read here, every line and count bounded as ``http.client`` bounds
them, and any answer that breaks the protocol is an error, never a guess.
"""

from __future__ import annotations

import socket
from typing import BinaryIO

# As http.client: the longest status or header line, and the most header lines.
MAX_LINE = 65536
MAX_HEADERS = 100


class WireError(OSError):
    """The engine's answer broke HTTP/1.1 (or the connection ended in the middle of it)."""


class Exchange:
    """One request sent on a connection of its own, and its answer: ``status``, ``reason``
    and the body, read with ``read`` (chunked or by length, as the engine sends it)."""

    def __init__(
        self,
        socket_path: str,
        timeout: float | None,
        method: str,
        target: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._file: BinaryIO | None = None
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(socket_path)
            head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            if body is not None:
                head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            elif method in ("POST", "PUT"):
                head += "Content-Length: 0\r\n"
            self._sock.sendall(head.encode("latin-1") + b"\r\n" + (body or b""))
            self._file = self._sock.makefile("rb")
            self.status, self.reason, headers = _read_head(self._file)
            self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            # Bytes of the body (or of the chunk) left; None: up to the connection's end.
            self._left: int | None = None
            if self._chunked:
                self._left = 0
            elif "content-length" in headers:
                self._left = _length(headers["content-length"])
        except BaseException:
            self.close()
            raise
        no_body = self.status in (204, 304) or self.status < 200
        self._done = no_body or (self._left == 0 and not self._chunked)

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body; b"" at its end."""
        if self._done or size <= 0 or self._file is None:
            return b""
        if self._chunked and self._left == 0:
            self._left = self._next_chunk()
            if self._left == 0:
                self._done = True
                return b""
        want = size if self._left is None else min(size, self._left)
        data = self._file.read(want)
        if self._left is None:
            self._done = not data
            return data
        if len(data) < want:
            raise WireError("the engine's connection ended inside an answer")
        self._left -= len(data)
        if self._chunked and self._left == 0 and self._file.read(2) != b"\r\n":
            raise WireError("the engine sent a chunk without its line end")
        if not self._chunked and self._left == 0:
            self._done = True
        return data

    def _next_chunk(self) -> int:
        """The size of the next chunk (0: the last, its trailer lines read)."""
        assert self._file is not None
        line = _line(self._file)
        size = line.split(b";", 1)[0].strip()
        try:
            length = int(size, 16)
        except ValueError:
            raise WireError(f"the engine sent a bad chunk size {size[:20]!r}") from None
        if length < 0:
            raise WireError("the engine sent a negative chunk size")
        if length == 0:
            for _ in range(MAX_HEADERS + 1):
                if _line(self._file) in (b"\r\n", b"\n"):
                    return 0
            raise WireError("the engine sent too many trailer lines")
        return length

    def close(self) -> None:
        """Close the connection."""
        if self._file is not None:
            self._file.close()
        self._sock.close()


def _line(stream: BinaryIO) -> bytes:
    line = stream.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise WireError("the engine sent a line longer than 64 KiB")
    if not line:
        raise WireError("the engine's connection ended inside an answer")
    return line


def _read_head(stream: BinaryIO) -> tuple[int, str, dict[str, str]]:
    """The status line and the headers (names lower-cased) of an answer."""
    status_line = _line(stream).decode("latin-1")
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise WireError(f"the engine sent a bad status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = _line(stream)
        if line in (b"\r\n", b"\n"):
            return int(code), reason.strip(), headers
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            raise WireError(f"the engine sent a bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    raise WireError("the engine sent more than 100 header lines")


def _length(value: str) -> int:
    if not value.isdigit():
        raise WireError(f"the engine sent a bad Content-Length {value[:20]!r}")
    return int(value)
