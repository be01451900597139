"""Statements compiled once to ``$n`` placeholders for the raw cursor of ``autocommit``."""

from __future__ import annotations

import pytest

from runyard.platform.db import positional


@pytest.mark.parametrize(
    ("pyformat", "expected"),
    [
        ("SELECT 1", ("SELECT 1", ())),
        ("SELECT %(a)s, %(b)s", ("SELECT $1, $2", ("a", "b"))),
        (
            "SELECT %(a)s WHERE x = %(a)s OR y = %(b)s",
            ("SELECT $1 WHERE x = $1 OR y = $2", ("a", "b")),
        ),
        ("SELECT '50%%' || %(job_id)s", ("SELECT '50%' || $1", ("job_id",))),
        ("SELECT '%%(a)s', %(a)s", ("SELECT '%(a)s', $1", ("a",))),
        (
            "SELECT CAST(%(now)s AS timestamptz)::text",
            ("SELECT CAST($1 AS timestamptz)::text", ("now",)),
        ),
    ],
)
def test_positional__numbers_each_name_once_and_unescapes_percent(
    pyformat: str, expected: tuple[str, tuple[str, ...]]
) -> None:
    assert positional(pyformat) == expected
