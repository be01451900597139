"""Masking secret values in output: whole, in pieces, at entry borders, in JSON."""

from __future__ import annotations

import random

import pytest

from runyard.registry.redact import Redactor, StreamRedactor


@pytest.mark.parametrize(
    ("values", "data", "expected"),
    [
        ([], b"s3cret", b"s3cret"),
        (["s3cret"], b"token=s3cret\n", b"token=***\n"),
        (["s3cret"], b"s3crets3cret", b"******"),
        (["abc", "bcd"], b"xabcdx", b"x***x"),  # overlapping values: one run
        (["abcd", "bc"], b"abcd bc", b"*** ***"),
        (["", "x"], b"axb", b"a***b"),  # an empty value masks nothing
        (["pässwort"], "pässwort!".encode(), b"***!"),
    ],
)
def test_mask__table(values: list[str], data: bytes, expected: bytes):
    assert Redactor(values).mask(data) == expected


@pytest.mark.parametrize(
    ("values", "data", "cut"),
    [
        (["secret"], b"hello sec", 6),  # "sec" may be the start of the secret
        (["secret"], b"hello\n", 6),  # nothing held: a quiet tool's last line goes out
        (["secret"], b"hello secret", 12),
        (["aab"], b"xaaa", 2),  # the longest open start, not the first one found
        (["abcd", "dxyz"], b"abcd", 0),  # "d" may start dxyz, but it ends abcd: hold it all
        (["aaaa"], b"aaa", 0),
    ],
)
def test_safe_cut__table(values: list[str], data: bytes, cut: int):
    assert Redactor(values).safe_cut(data) == cut


def test_safe_cut__lands_on_an_entry_border():
    redactor = Redactor(["secret"])
    # Entries: b"line one\n", b"and sec"; the held part starts inside the second.
    assert redactor.safe_cut(b"line one\nand sec", boundaries=[0, 9]) == 9
    assert redactor.safe_cut(b"line one\nand more", boundaries=[0, 9]) == 17


def test_stream__a_secret_split_over_pieces_never_shows():
    values = ["abca", "bcab", "aa", "c" * 40]
    redactor = Redactor(values)
    rng = random.Random(7)
    for _ in range(400):
        whole = bytes(rng.choice(b"abcx") for _ in range(rng.randint(0, 60)))
        whole += b"c" * rng.choice([0, 39, 41])
        stream = StreamRedactor(redactor)
        out = b""
        rest = whole
        while rest:
            size = rng.randint(1, 5)
            out += stream.feed(rest[:size])
            rest = rest[size:]
        out += stream.finish()
        assert out == redactor.mask(whole)
        for value in values:
            assert value.encode() not in out


def test_stream__holds_back_only_a_possible_start():
    stream = StreamRedactor(Redactor(["TOPSECRET"]))
    assert stream.feed(b"value: TOP") == b"value: "
    assert stream.feed(b"SECRET done\n") == b"*** done\n"
    assert stream.feed(b"TOPS") == b""
    assert stream.finish() == b"TOPS"


def test_json__masks_strings_and_keys():
    redactor = Redactor(["k3y"])
    doc = {"a": ["x k3y", 1, None, {"k3y": True}], "b": 2.5}
    assert redactor.json(doc) == {"a": ["x ***", 1, None, {"***": True}], "b": 2.5}
    assert Redactor([]).json(doc) is doc


def test_safe_cut__a_long_value_is_quick():
    value = "a" * 65536
    redactor = Redactor([value])
    data = b"a" * 65535
    assert redactor.safe_cut(b"x" + data) == 1
