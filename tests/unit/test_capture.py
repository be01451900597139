"""Bounded output capture."""

from __future__ import annotations

from runyard.platform.capture import HeadTailBuffer, capture, to_text


def test_small_output__kept_whole():
    buf = capture([b"hello ", b"world"], cap=1024)
    assert buf.text() == "hello world" and not buf.truncated


def test_large_output__keeps_head_and_tail_and_flags():
    chunks = [b"HEAD"] + [b"x" * 1000] * 1000 + [b"TAIL"]
    buf = capture(chunks, cap=100)
    text = buf.text()
    assert buf.truncated and text.startswith("HEAD") and text.endswith("TAIL")
    assert "bytes truncated" in text and len(text) < 200
    assert buf.total == 8 + 1000 * 1000


def test_memory__bounded_whatever_is_written():
    buf = HeadTailBuffer(64)
    for _ in range(10_000):
        buf.write(b"y" * 4096)
    assert len(buf._head) + len(buf._tail) == 64


def test_nul_and_invalid_utf8__become_replacement_characters():
    assert to_text(b"a\x00b\xffc") == "a\ufffdb\ufffdc"
