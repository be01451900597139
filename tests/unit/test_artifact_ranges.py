"""The Range rule of artifact downloads."""

from __future__ import annotations

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
        ("bytes=0-" + "9" * 5000, 10, ByteRange(0, 10, 10)),
        ("bytes=-" + "9" * 5000, 10, ByteRange(0, 10, 10)),
        ("bytes=" + "0" * 5000 + "3-" + "0" * 4000 + "4", 10, ByteRange(3, 5, 10)),
        ("bytes=5-" + "1" + "0" * 30, 10, ByteRange(5, 10, 10)),
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
        ("bytes=" + "9" * 5000 + "-", 10),
        ("bytes=" + "9" * 5000 + "-" + "9" * 5000, 10),
        ("bytes=" + "1" + "0" * 18 + "-", 10**18),
    ],
)
def test_parse_range__past_the_end_is_unsatisfiable(header: str, size: int):
    with pytest.raises(Unsatisfiable):
        parse_range(header, size)


def test_byte_range__content_range_and_length():
    wanted = ByteRange(2, 5, 10)
    assert (wanted.length, wanted.content_range) == (3, "bytes 2-4/10")
