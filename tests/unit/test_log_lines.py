"""Log views stamp each chunk that starts a line."""

from __future__ import annotations

from datetime import UTC, datetime

from runyard.domain.log_lines import stamp_pieces

T1 = datetime(2026, 11, 27, 3, 1, 2, tzinfo=UTC)
T2 = datetime(2026, 11, 27, 3, 1, 5, tzinfo=UTC)
T3 = datetime(2026, 11, 27, 3, 2, 0, tzinfo=UTC)


def test_stamp_pieces__stamps_only_chunks_that_start_a_line():
    pieces = stamp_pieces([(T1, "one\ntw"), (T2, "o\n"), (T2, ""), (T3, "three\n")])
    assert [(p.text, p.stamp) for p in pieces] == [
        ("one\ntw", "03:01:02"),
        ("o\n", None),
        ("three\n", "03:02:00"),
    ]


def test_stamp_pieces__of_nothing_is_nothing():
    assert stamp_pieces([]) == []
