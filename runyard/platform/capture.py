"""Bounded capture of a byte stream: keeps the head and the tail, counts what it dropped."""

from __future__ import annotations

from collections.abc import Iterable


class HeadTailBuffer:
    """Keep at most ``cap`` bytes: the first half and the last half of what was written."""

    def __init__(self, cap: int) -> None:
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def write(self, chunk: bytes) -> None:
        """Append a chunk; memory stays bounded by ``cap`` whatever is written."""
        self.total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk[-self._tail_cap :]
            if len(self._tail) > self._tail_cap:
                del self._tail[: len(self._tail) - self._tail_cap]

    @property
    def truncated(self) -> bool:
        """True when some bytes in the middle were dropped."""
        return self.total > len(self._head) + len(self._tail)

    def text(self) -> str:
        """The kept bytes as text, with a marker where the middle was dropped."""
        dropped = self.total - len(self._head) - len(self._tail)
        middle = f"\n[... {dropped} bytes truncated ...]\n".encode() if dropped else b""
        return to_text(bytes(self._head) + middle + bytes(self._tail))


def to_text(data: bytes) -> str:
    """Decode as UTF-8 with replacement; NUL bytes (which Postgres text refuses) become U+FFFD."""
    return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def capture(chunks: Iterable[bytes], cap: int) -> HeadTailBuffer:
    """Drain an iterable of chunks into a bounded buffer."""
    buffer = HeadTailBuffer(cap)
    for chunk in chunks:
        buffer.write(chunk)
    return buffer
