"""Where a log view shows times: at each chunk that starts a line, so a line carries the time
the worker stored its first piece and a chunk that continues a line adds no stamp mid-line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class LogPiece:
    """A chunk's text and, when it starts a line, the time shown before it (``HH:MM:SS``)."""

    text: str
    stamp: str | None
    at: datetime


def stamp_pieces(chunks: Iterable[tuple[datetime, str]]) -> list[LogPiece]:
    """One stream's chunks in order, each stamped when it starts a line (empty ones dropped)."""
    pieces = []
    at_line_start = True
    for at, text in chunks:
        if not text:
            continue
        stamp = at.astimezone(UTC).strftime("%H:%M:%S") if at_line_start else None
        pieces.append(LogPiece(text=text, stamp=stamp, at=at))
        at_line_start = text.endswith("\n")
    return pieces
