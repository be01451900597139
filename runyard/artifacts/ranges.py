"""The ``Range`` header of a download, as a pure rule: one byte range, or the whole file."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Each part can match in one way only (no two runs of spaces meet around an empty position),
# so a failed match costs one pass, not one per split of a run of spaces.
_ONE_RANGE = re.compile(
    r"^\s*bytes\s*=\s*(?:(\d+)\s*)?-\s*(?:(\d+)\s*)?$", re.IGNORECASE | re.ASCII
)
# A header longer than this is no single range anyone sends (two 18-digit positions take 43
# characters): ignored before it is matched.
MAX_HEADER_CHARS = 200
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
    if header is None or len(header) > MAX_HEADER_CHARS:
        return None
    match = _ONE_RANGE.match(header)
    if match is None:
        return None
    first, last = match.group(1) or "", match.group(2) or ""
    if not first and not last:
        return None
    if not first:
        suffix = _position(last)
        if suffix == 0 or size == 0:
            raise Unsatisfiable(header)
        return ByteRange(max(size - suffix, 0), size, size)
    if last and _before(last, first):
        return None  # "bytes=5-2" is invalid syntax: ignored, however long the positions
    start = _position(first)
    stop = size if not last else _position(last) + 1
    if start >= size:
        raise Unsatisfiable(header)
    return ByteRange(start, min(stop, size), size)


def _position(digits: str) -> int:
    """A byte position as written, or ``_BEYOND_ANY_FILE`` for one too long to be a file's."""
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= _MAX_DIGITS else _BEYOND_ANY_FILE


def _before(digits: str, other: str) -> bool:
    """Whether the position ``digits`` is less than ``other``, both as written (compared as
    numbers of any length, before either is converted or clipped)."""
    a, b = digits.lstrip("0"), other.lstrip("0")
    return (len(a), a) < (len(b), b)
