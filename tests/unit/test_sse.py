"""The client's SSE parser: whatever a server sends, it neither crashes nor grows unbounded."""

from __future__ import annotations

import json

import pytest

from runyard.client.sse import MAX_EVENT_BYTES, SseEvent, SseParser


def parse(
    stream: bytes, *, chunk: int | None = None, limit: int = MAX_EVENT_BYTES
) -> list[SseEvent]:
    parser = SseParser(max_event_bytes=limit)
    size = chunk or max(len(stream), 1)
    events: list[SseEvent] = []
    for start in range(0, len(stream), size):
        events += parser.feed(stream[start : start + size])
    return events + parser.close()


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        # What the API sends: retry hint, keepalive comment, id/event/data.
        (
            b'retry: 2000\n\n: keepalive\n\nid: 7\nevent: stdout\ndata: {"text": "hi"}\n\n',
            [SseEvent("7", "stdout", '{"text": "hi"}')],
        ),
        # Multi-line data joins with newlines; no space after the colon is fine.
        (b"data:a\ndata: b\ndata\n\n", [SseEvent("", "message", "a\nb\n")]),
        # Unknown fields and event types pass through / are ignored, not fatal.
        (b"event: surprise\nfoo: bar\ndata: x\n\n", [SseEvent("", "surprise", "x")]),
        # An event without data is not dispatched; the id still sticks.
        (b"id: 3\nevent: status\n\ndata: y\n\n", [SseEvent("3", "message", "y")]),
        # CRLF and lone CR end lines too; only one leading space is removed.
        (
            b"data:  two\r\n\r\ndata: z\r\r",
            [SseEvent("", "message", " two"), SseEvent("", "message", "z")],
        ),
        # A byte order mark at the start is skipped; invalid UTF-8 is replaced, not raised.
        (b"\xef\xbb\xbfdata: \xff\xfe\n\n", [SseEvent("", "message", "\ufffd\ufffd")]),
        # An id with NUL is ignored; the stream's end drops an undispatched event.
        (b"id: 1\x00\ndata: q\n\ndata: never", [SseEvent("", "message", "q")]),
        # Nothing but comments and blank lines.
        (b":\n: ping\n\n\n\n", []),
    ],
)
def test_sse_parser__table(stream: bytes, expected: list[SseEvent]):
    assert parse(stream) == expected
    # Byte by byte gives the same events: lines and CRLF pairs may split anywhere.
    assert parse(stream, chunk=1) == expected


def test_sse_parser__retry_hint_is_kept():
    parser = SseParser()
    parser.feed(b"retry: 2500\n\nretry: soon\n\n")
    assert parser.retry_ms == 2500


def test_sse_parser__data_line_over_one_mib_is_delivered():
    text = "x" * (3 * 1024 * 1024)
    stream = b"event: stdout\ndata: " + json.dumps({"text": text}).encode() + b"\n\n"
    events = parse(stream, chunk=64 * 1024)
    assert len(events) == 1
    assert events[0].payload() == {"text": text}


@pytest.mark.parametrize("chunk", [None, 7, 4096])
def test_sse_parser__event_over_the_limit_is_dropped_and_the_next_one_parsed(chunk: int | None):
    big = b"data: " + b"y" * 5000 + b"\r\ndata: tail\r\n\r\n"
    many_lines = b"".join(b"data: " + b"z" * 100 + b"\n" for _ in range(100)) + b"\n"
    stream = b"id: 1\nevent: stdout\n" + big + many_lines + b"id: 2\nevent: status\ndata: ok\n\n"
    parser = SseParser(max_event_bytes=1000)
    size = chunk or len(stream)
    events: list[SseEvent] = []
    for start in range(0, len(stream), size):
        events += parser.feed(stream[start : start + size])
    assert events == [SseEvent("2", "status", "ok")]
    assert parser.dropped == 2


def test_sse_parser__memory_stays_bounded_on_an_endless_line():
    parser = SseParser(max_event_bytes=1000)
    for _ in range(1000):
        assert parser.feed(b"data: " + b"w" * 500) == []
        assert len(parser._buffer) <= 1000 + 506
    assert parser.feed(b"\n\ndata: after\n\n") == [SseEvent("", "message", "after")]
    assert parser.dropped == 1


@pytest.mark.parametrize(
    ("data", "payload"),
    [
        ('{"status": "running"}', {"status": "running"}),
        ("not json", None),
        ("[1, 2]", None),
        ('"text"', None),
        ("NaN", None),
        ("", None),
    ],
)
def test_sse_event_payload__only_json_objects(data: str, payload: object):
    assert SseEvent("", "status", data).payload() == payload
