"""The live log follower reads by log entry: memory stays at one flush whatever is printed."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Any

from runyard.registry.redact import Redactor
from runyard.runners.docker.live_logs import FLUSH_BYTES, LogFollower

PIECE = 16 * 1024  # the engine splits output without newlines into 16 KiB entries


class Entries:
    """A follow stream of entries, each an engine timestamp and a payload."""

    def __init__(self, payloads: Iterator[bytes]) -> None:
        self._payloads = payloads
        self._response = self

    def __iter__(self) -> Iterator[bytes]:
        for index, payload in enumerate(self._payloads):
            yield f"2026-01-01T00:00:{index // 1000000:02d}.{index:09d}Z ".encode() + payload

    def close(self) -> None:
        return None


class Container:
    def __init__(self, payloads: Iterator[bytes]) -> None:
        self.payloads = payloads

    def logs(self, **kwargs: Any) -> Entries:
        return Entries(self.payloads)


class Sink:
    """Keeps the size of every chunk and the text of the last one."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.last = ""

    def resume_point(self, stream: str) -> str | None:
        return None

    def write(self, stream: str, text: str, until: str) -> bool:
        self.sizes.append(len(text))
        self.last = text
        return True


class TextSink(Sink):
    """Keeps every chunk's text."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def write(self, stream: str, text: str, until: str) -> bool:
        self.texts.append(text)
        return True


def _follow(payloads: Iterator[bytes], cap: int) -> tuple[Sink, int]:
    sink = Sink()
    follower = LogFollower(Container(payloads), "stdout", sink, cap)
    tracemalloc.start()
    try:
        follower._run()  # in this thread, so tracemalloc sees its allocations
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return sink, peak


def _pieces(total: int) -> Iterator[bytes]:
    return (b"x" * PIECE for _ in range(total // PIECE))


def test_follower__150_mb_without_a_newline_is_capped():
    sink, peak = _follow(_pieces(150 << 20), cap=1 << 20)
    assert (1 << 20) <= sum(sink.sizes) < (1 << 20) + 200  # the cap, plus the marker
    assert sink.last.endswith("[live log truncated; the stored log keeps head and tail]\n")
    assert peak < 16 * FLUSH_BYTES  # O(flush), against a stream of 64 or 150 MiB


def test_follower__memory_stays_at_one_flush_under_a_large_cap():
    sink, peak = _follow(_pieces(64 << 20), cap=1 << 30)
    assert sum(sink.sizes) == 64 << 20
    assert max(sink.sizes) <= FLUSH_BYTES + PIECE
    assert peak < 16 * FLUSH_BYTES  # O(flush), against a stream of 64 or 150 MiB


def test_follower__binary_and_invalid_utf8_arrive_as_text():
    pieces = iter([b"\xff\xfe\x00binary\n", bytes(range(256)), b"tail\n"])
    sink = TextSink()
    LogFollower(Container(pieces), "stdout", sink, 1 << 20)._run()
    joined = "".join(sink.texts)
    assert joined.startswith("\ufffd\ufffd\ufffdbinary\n") and joined.endswith("tail\n")
    assert "\x00" not in joined


def test_follower__partial_entries_keep_no_timestamps_in_the_text():
    pieces = iter([b"a" * PIECE, b"b" * PIECE, b"end\n"])
    sink = TextSink()
    LogFollower(Container(pieces), "stdout", sink, 1 << 20)._run()
    assert "".join(sink.texts) == "a" * PIECE + "b" * PIECE + "end\n"


class StampSink(TextSink):
    """Keeps every chunk's text and the stamp it ends at."""

    def __init__(self) -> None:
        super().__init__()
        self.untils: list[str] = []

    def write(self, stream: str, text: str, until: str) -> bool:
        self.untils.append(until)
        return super().write(stream, text, until)


def test_follower__a_secret_split_over_two_flushes_is_masked():
    # The first entry fills a flush and ends with the secret's start: it waits for the next.
    pieces = iter([b"x" * FLUSH_BYTES + b" token=TOPSE", b"CRET tail\n", b"y" * FLUSH_BYTES])
    sink = StampSink()
    LogFollower(Container(pieces), "stdout", sink, 1 << 20, Redactor(["TOPSECRET"]))._run()
    joined = "".join(sink.texts)
    assert joined == "x" * FLUSH_BYTES + " token=*** tail\n" + "y" * FLUSH_BYTES
    assert not any("TOPSE" in text or "CRET" in text for text in sink.texts)
    # Held by whole entries: the first chunk ends at the second entry's stamp, not the first.
    assert sink.untils[0].endswith(".000000001Z")


def test_follower__a_secret_at_the_very_end_is_masked_when_the_stream_ends():
    pieces = iter([b"x" * FLUSH_BYTES + b"TOP", b"SEC", b"RET"])
    sink = StampSink()
    LogFollower(Container(pieces), "stdout", sink, 1 << 20, Redactor(["TOPSECRET"]))._run()
    assert "".join(sink.texts) == "x" * FLUSH_BYTES + "***"
