"""The gate for JSON written by tools: what it accepts, what it refuses and how it says so."""

from __future__ import annotations

import json

import pytest

from runyard.domain.tool_json import (
    MAX_STORED_DEPTH,
    UNREADABLE_KEY,
    ToolJsonError,
    decode_result,
    decode_tool_json,
    load_stored_json,
)


def _nested(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"a": [1, 2.5, "x", null, true]}', {"a": [1, 2.5, "x", None, True]}),
        (b"3", 3),
        (b'"\\u00e9t\\u00e9 \\ud83d\\ude00"', "été 😀"),
        (b"1e308", 1e308),
        (b"-0.0", -0.0),
        (_nested(64), json.loads(_nested(64))),
        (b'{"k": "line\\nbreak"}', {"k": "line\nbreak"}),
    ],
)
def test_decode_tool_json__accepts_rfc_8259(data: bytes, expected: object):
    assert decode_tool_json(data) == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"NaN", "NaN is not JSON at line 1"),
        (b'{\n "a": "NaN",\n "b": [Infinity]}', "Infinity is not JSON at line 3"),
        (b"[-Infinity]", "-Infinity is not JSON at line 1"),
        (b"[1e400]", "the number 1e400 is out of range"),
        (b"-1e400", "the number -1e400 is out of range"),
        (b'"a\\u0000b"', "a string holds \\u0000, which cannot be stored"),
        (b'{"\\u0000": 1}', "a string holds \\u0000, which cannot be stored"),
        (b'["\\ud800"]', "a string holds a lone surrogate \\ud800, which is not Unicode text"),
        (b'{"x": "\\udc00"}', "lone surrogate \\udc00"),
        (_nested(65), "it nests deeper than 64 levels"),
        (_nested(300), "it nests deeper than 64 levels"),
        (_nested(5000), "it nests deeper than 64 levels"),
        (b"\xff\xfe", "it is not UTF-8 text (byte 0)"),
        ("\ufeff{}".encode(), "byte order mark"),
        (b"", "Expecting value at line 1 column 1"),
        (b'{"a": 1,}', "at line 1"),
        (b"1" * 5000, "digits"),
    ],
)
def test_decode_tool_json__refuses_what_jsonb_or_serializers_cannot_hold(data: bytes, message: str):
    with pytest.raises(ToolJsonError) as caught:
        decode_tool_json(data)
    assert message in str(caught.value)


def test_decode_tool_json__depth_bound_is_the_tools():
    assert decode_tool_json(_nested(3), max_depth=3) == [[[]]]
    with pytest.raises(ToolJsonError, match="deeper than 2 levels"):
        decode_tool_json(_nested(3), max_depth=2)


def test_decode_result__names_the_file():
    assert decode_result(b"NaN") == (None, "result.json: NaN is not JSON at line 1")
    assert decode_result(b'{"ok": 1}') == ({"ok": 1}, None)


def test_load_stored_json__serves_deep_rows_as_a_marker():
    assert load_stored_json('{"a": [1]}') == {"a": [1]}
    assert load_stored_json(_nested(MAX_STORED_DEPTH)) == json.loads(_nested(MAX_STORED_DEPTH))
    for depth in (MAX_STORED_DEPTH + 1, 300, 5000):
        marker = load_stored_json(_nested(depth).decode())
        assert set(marker) == {UNREADABLE_KEY}
        assert f"deeper than {MAX_STORED_DEPTH} levels" in marker[UNREADABLE_KEY]
    # Many brackets at a shallow depth are served as they are.
    wide = json.dumps([[1]] * 1000)
    assert load_stored_json(wide) == [[1]] * 1000
