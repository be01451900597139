"""The ``Range`` header of a download, as a pure rule: one byte range, or the whole file."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONE_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)
# A position of more digits than this is past the end of any file: it is never converted
# (``int`` refuses strings of thousands of digits, and would spend time on long ones).
_MAX_DIGITS = 18
_BEYOND_ANY_FILE = 10**_MAX_DIGITS


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``start`` to ``stop`` (exclusive) of a file of ``size`` bytes."""

    start: int
    stop: int
    size: int

    @property
    def length(self) -> int:
        """How many bytes the range holds."""
        return self.stop - self.start

    @property
    def content_range(self) -> str:
        """The ``Content-Range`` of a 206 answer."""
        return f"bytes {self.start}-{self.stop - 1}/{self.size}"


class Unsatisfiable(Exception):
    """The range asks for no byte of the file (416, ``Content-Range: bytes */size``)."""


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The one range ``header`` asks for, clipped to the file; None: send the whole file.

    Headers this does not understand (several ranges, other units, bad syntax) are ignored,
    as HTTP allows, and the whole file is sent; a well-formed range past the end raises
    ``Unsatisfiable``.
    """
    if header is None:
        return None
    match = _ONE_RANGE.match(header)
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if not first and not last:
        return None
    if not first:
        suffix = _position(last)
        if suffix == 0 or size == 0:
            raise Unsatisfiable(header)
        return ByteRange(max(size - suffix, 0), size, size)
    start = _position(first)
    stop = size if not last else _position(last) + 1
    if last and stop <= start:
        return None  # "bytes=5-2" is invalid syntax: ignored
    if start >= size:
        raise Unsatisfiable(header)
    return ByteRange(start, min(stop, size), size)


def _position(digits: str) -> int:
    """A byte position as written, or ``_BEYOND_ANY_FILE`` for one too long to be a file's."""
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= _MAX_DIGITS else _BEYOND_ANY_FILE
