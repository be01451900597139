"""The Range rule of artifact downloads."""

from __future__ import annotations

import time

import pytest

from runyard.artifacts.ranges import ByteRange, Unsatisfiable, parse_range


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, None),
        ("bytes=0-3", 10, ByteRange(0, 4, 10)),
        ("bytes=4-", 10, ByteRange(4, 10, 10)),
        ("bytes=-3", 10, ByteRange(7, 10, 10)),
        ("bytes=-30", 10, ByteRange(0, 10, 10)),
        ("bytes=5-100", 10, ByteRange(5, 10, 10)),
        ("bytes=9-9", 10, ByteRange(9, 10, 10)),
        ("BYTES = 1 - 2", 10, ByteRange(1, 3, 10)),
        ("bytes=0-1,4-5", 10, None),  # several ranges: the whole file
        ("items=0-1", 10, None),
        ("bytes=5-2", 10, None),
        ("bytes=-", 10, None),
        ("garbage", 10, None),
        # Positions longer than any file's are never converted: clipped to the file.
        ("bytes=0-" + "9" * 150, 10, ByteRange(0, 10, 10)),
        ("bytes=-" + "9" * 150, 10, ByteRange(0, 10, 10)),
        ("bytes=" + "0" * 90 + "3-" + "0" * 90 + "4", 10, ByteRange(3, 5, 10)),
        ("bytes=5-" + "1" + "0" * 30, 10, ByteRange(5, 10, 10)),
        # Backwards, whatever the length of the positions: ignored, before any clipping.
        ("bytes=" + "2" + "0" * 19 + "-" + "1" + "0" * 19, 10, None),
        ("bytes=" + "9" * 20 + "-" + "9" * 19, 10, None),
        ("bytes=" + "0" * 50 + "5-" + "0" * 60 + "2", 10, None),
        # Spaces wherever the syntax allows them, within the length bound.
        ("bytes=" + " " * 150 + "1" + " " * 20 + "-" + " " * 20 + "2", 10, ByteRange(1, 3, 10)),
        ("bytes=" + " " * 150 + "-" + " " * 30 + "x", 10, None),
        # Longer than any single range: ignored, never matched.
        ("bytes=0-" + " " * 200, 10, None),
        ("bytes=" + " " * 16_000, 10, None),
        ("bytes=0-" + "9" * 5000, 10, None),
        ("bytes=" + "9" * 5000 + "-", 10, None),
        # Only ASCII digits are positions.
        ("bytes=\u0663-\u0664", 10, None),
    ],
)
def test_parse_range__table(header: str | None, size: int, expected: ByteRange | None):
    assert parse_range(header, size) == expected


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=10-", 10),
        ("bytes=10-20", 10),
        ("bytes=-0", 10),
        ("bytes=0-", 0),
        ("bytes=" + "9" * 90 + "-", 10),
        ("bytes=" + "9" * 90 + "-" + "9" * 90, 10),
        ("bytes=" + "1" + "0" * 18 + "-", 10**18),
        ("bytes=" + "1" * 20 + "-" + "2" * 20, 10),
        ("bytes=" + "1" + "0" * 19 + "-" + "1" + "0" * 19, 10**18),  # one byte, past the end
    ],
)
def test_parse_range__past_the_end_is_unsatisfiable(header: str, size: int):
    with pytest.raises(Unsatisfiable):
        parse_range(header, size)


def test_parse_range__a_long_header_is_answered_at_once():
    # Matching 200,000 spaces split every way took minutes; a safety bound, not a target.
    began = time.monotonic()
    assert parse_range("bytes=" + " " * 200_000, 10) is None
    assert parse_range("bytes=" + " " * 190 + "-x", 10) is None
    assert time.monotonic() - began < 2.0


def test_byte_range__content_range_and_length():
    wanted = ByteRange(2, 5, 10)
    assert (wanted.length, wanted.content_range) == (3, "bytes 2-4/10")
