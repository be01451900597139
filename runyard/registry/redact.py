"""Masking a tool's secret values in what it prints and returns, also across chunk borders."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

MASK = b"***"
MASK_TEXT = MASK.decode()


class Redactor:
    """Replaces every byte that belongs to an occurrence of a secret value with ``***``."""

    def __init__(self, values: Iterable[str]) -> None:
        found = {value.encode("utf-8") for value in values if value}
        self._values = sorted(found, key=len, reverse=True)
        self._borders = [_borders(value) for value in self._values]

    @property
    def active(self) -> bool:
        """True when there is something to mask."""
        return bool(self._values)

    def _covered(self, data: bytes) -> list[tuple[int, int]]:
        """The spans of every occurrence of every value, overlapping ones included."""
        spans = []
        for value in self._values:
            start = data.find(value)
            while start != -1:
                spans.append((start, start + len(value)))
                start = data.find(value, start + 1)
        return sorted(spans)

    def mask(self, data: bytes) -> bytes:
        """``data`` with each run of secret bytes replaced by one ``***``."""
        if not self._values:
            return data
        out = bytearray()
        done = 0
        for start, end in self._covered(data):
            if end <= done:
                continue
            if start >= done:
                out += data[done:start] + MASK
            done = end
        out += data[done:]
        return bytes(out)

    def safe_cut(self, data: bytes, boundaries: Sequence[int] = ()) -> int:
        """The longest prefix of ``data`` that can be masked and sent now: what follows the
        cut may be the start of a secret that the next bytes complete, and no occurrence
        is split by it. With ``boundaries`` (sorted offsets), the cut is one of them or
        ``len(data)``."""
        if not self._values:
            return len(data)
        cut = len(data)
        for value, borders in zip(self._values, self._borders, strict=True):
            cut = min(cut, len(data) - _open_prefix(data[-(len(value) - 1) :], value, borders))
        spans = self._covered(data)
        while True:
            moved = cut
            for start, end in spans:
                if start < moved < end:
                    moved = start
            if boundaries and moved not in boundaries and moved != len(data):
                moved = max((b for b in boundaries if b <= moved), default=0)
            if moved == cut:
                return cut
            cut = moved

    def text(self, value: str) -> str:
        """A string with the values masked."""
        if not self._values:
            return value
        return self.mask(value.encode("utf-8", errors="surrogatepass")).decode(
            "utf-8", errors="replace"
        )

    def json(self, value: Any) -> Any:
        """A JSON document with the values masked in every string and key."""
        if not self._values:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.json(item) for item in value]
        if isinstance(value, dict):
            return {self.text(key): self.json(item) for key, item in value.items()}
        return value


def _borders(value: bytes) -> list[int]:
    """For each prefix of ``value``, the length of its longest proper prefix that is also
    its suffix (the matcher's fall-back table)."""
    borders = [0] * len(value)
    size = 0
    for at in range(1, len(value)):
        while size and value[at] != value[size]:
            size = borders[size - 1]
        if value[at] == value[size]:
            size += 1
        borders[at] = size
    return borders


def _open_prefix(data: bytes, value: bytes, borders: list[int]) -> int:
    """The length of the longest suffix of ``data`` that is a proper prefix of ``value``:
    linear, where trying every suffix would be quadratic in the value's length."""
    if len(value) < 2:
        return 0
    size = 0
    for byte in data:
        while size and value[size] != byte:
            size = borders[size - 1]
        if value[size] == byte:
            size += 1
        if size == len(value):
            size = borders[size - 1]
    return size


class StreamRedactor:
    """Masks one byte stream that arrives in pieces, holding back only a possible start of
    a secret until the next piece (or the end) shows whether it is one."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""
        # Set once some bytes passed on were masked: the stream held a secret value.
        self.found = False

    def feed(self, piece: bytes) -> bytes:
        """The masked bytes that can be passed on now."""
        if not self._redactor.active:
            return piece
        data = self._held + piece
        cut = self._redactor.safe_cut(data)
        self._held = data[cut:]
        return self._masked(data[:cut])

    def finish(self) -> bytes:
        """The rest, at the end of the stream."""
        data, self._held = self._held, b""
        return self._masked(data)

    def _masked(self, data: bytes) -> bytes:
        masked = self._redactor.mask(data)
        if masked != data:
            self.found = True
        return masked
