"""The dashboard's search terms: ids, id prefixes, text, and day bounds."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime

import pytest

from runyard.domain.run_search import (
    IdRange,
    SearchIn,
    SearchTerm,
    day_bounds,
    id_range,
    parse_day,
    parse_search,
)

RUN = "3f2a9c1e-0b7d-4c55-9a1e-2d3c4b5a6f70"


@pytest.mark.parametrize(
    ("query", "low", "high"),
    [
        ("3f2a", "3f2a0000-0000-0000-0000-000000000000", "3f2affff-ffff-ffff-ffff-ffffffffffff"),
        (
            "3F2A9C1E-0b",
            "3f2a9c1e-0b00-0000-0000-000000000000",
            "3f2a9c1e-0bff-ffff-ffff-ffffffffffff",
        ),
        (RUN, RUN, RUN),
    ],
)
def test_id_range__covers_every_id_with_the_prefix(query: str, low: str, high: str):
    assert id_range(query) == IdRange(uuid.UUID(low), uuid.UUID(high))


@pytest.mark.parametrize("query", ["3f2", "cafe babe", "xyz1", RUN + "0", "-" * 8])
def test_id_range__is_none_for_what_is_no_prefix(query: str):
    assert id_range(query) is None


@pytest.mark.parametrize(
    ("query", "where", "expected"),
    [
        ("", SearchIn.AUTO, None),
        ("   ", SearchIn.INPUT, None),
        ("x" * 201, SearchIn.AUTO, None),
        ("3f2a", SearchIn.AUTO, SearchTerm(ids=id_range("3f2a"))),
        ("3f2a", SearchIn.INPUT, SearchTerm(text="3f2a", in_input=True)),
        ("hello", SearchIn.AUTO, SearchTerm(text="hello", in_input=True, in_error=True)),
        (" exit 3 ", SearchIn.ERROR, SearchTerm(text="exit 3", in_error=True)),
        (
            "hello",
            SearchIn.ID,
            SearchTerm(ids=IdRange(uuid.UUID(int=1), uuid.UUID(int=0))),
        ),
    ],
)
def test_parse_search__reads_the_box_and_its_choice(
    query: str, where: SearchIn, expected: SearchTerm | None
):
    assert parse_search(query, where) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2026-11-27", date(2026, 11, 27)), ("2026-02-30", None), ("27.11.2026", None), (None, None)],
)
def test_parse_day__accepts_only_a_calendar_date(value: str | None, expected: date | None):
    assert parse_day(value) == expected


def test_day_bounds__include_both_whole_days():
    start, end = day_bounds(date(2026, 11, 1), date(2026, 11, 2))
    assert start == datetime(2026, 11, 1, tzinfo=UTC)
    assert end == datetime(2026, 11, 3, tzinfo=UTC)
    assert day_bounds(None, None) == (None, None)
