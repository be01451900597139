"""What a dashboard search means: a run id, a prefix of one, or text in inputs and errors."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum

# A prefix this short matches too many ids to be worth a lookup of its own.
MIN_ID_PREFIX = 4
LONGEST_QUERY = 200
_ID_CHARS = re.compile(r"[0-9a-fA-F-]+")


class SearchIn(StrEnum):
    """Where a search looks; ``AUTO`` reads an id-like query as an id, anything else as text."""

    AUTO = ""
    ID = "id"
    INPUT = "input"
    ERROR = "error"


@dataclass(frozen=True)
class IdRange:
    """Every run id that starts with a prefix: ``low <= id <= high`` (a primary-key range)."""

    low: uuid.UUID
    high: uuid.UUID


@dataclass(frozen=True)
class SearchTerm:
    """A parsed search: an id range, or text to find in the input and/or the error."""

    ids: IdRange | None = None
    text: str | None = None
    in_input: bool = False
    in_error: bool = False


def id_range(query: str) -> IdRange | None:
    """The ids that start with ``query`` (hex digits, dashes anywhere); None if it is no prefix."""
    if not _ID_CHARS.fullmatch(query):
        return None
    digits = query.replace("-", "").lower()
    if len(digits) < MIN_ID_PREFIX or len(digits) > 32:
        return None
    return IdRange(
        uuid.UUID(digits.ljust(32, "0")),
        uuid.UUID(digits.ljust(32, "f")),
    )


def parse_search(query: str | None, where: SearchIn) -> SearchTerm | None:
    """The term a search box and its "in" choice ask for; None when there is nothing to find."""
    text = (query or "").strip()
    if not text or len(text) > LONGEST_QUERY:
        return None
    ids = id_range(text)
    if where is SearchIn.ID or (where is SearchIn.AUTO and ids is not None):
        # An id that is not hex finds nothing: an empty range, not a text search.
        return SearchTerm(ids=ids or IdRange(uuid.UUID(int=1), uuid.UUID(int=0)))
    return SearchTerm(
        text=text,
        in_input=where in (SearchIn.AUTO, SearchIn.INPUT),
        in_error=where in (SearchIn.AUTO, SearchIn.ERROR),
    )


def parse_day(value: str | None) -> date | None:
    """A ``YYYY-MM-DD`` from a date field, or None for anything else."""
    if not value or len(value) != 10:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        return None


def day_bounds(first: date | None, last: date | None) -> tuple[datetime | None, datetime | None]:
    """``requested_at`` bounds of the days ``first`` to ``last`` (UTC, both whole days
    included): the start, and the first instant after."""
    start = datetime.combine(first, time(), UTC) if first is not None else None
    end = datetime.combine(last + timedelta(days=1), time(), UTC) if last is not None else None
    return start, end
