"""The request guard's JSON checks, without a server."""

from __future__ import annotations

import json

import pytest

from api.guard import BadJson, check_json, is_json_media_type, parse_json


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b"{", "invalid_json", None),
        (b'{"a": Infinity}', "invalid_json", None),
        (b'{"a": -1e999}', "invalid_json", None),
        (b'{"a": 1, "a": 2}', "duplicate_key", "a"),
        (b"[" * 65 + b"]" * 65, "json_too_deep", "[0]" * 64),
        (b"[" * 50000 + b"]" * 50000, "json_too_deep", None),
        (b'{"a": {"b": ["x\\u0000"]}}', "nul_character", "a.b[0]"),
        (b'{"k\\u0000": 1}', "nul_character", "k\x00"),
        (b'["\\udfff"]', "invalid_unicode", "[0]"),
        # A surrogate in its UTF-8 form, and one in a UTF-16 body: no escape names either.
        (b'{"a": ["\xed\xbf\xbf"]}', "invalid_unicode", "a[0]"),
        ('{"a": "\udfff"}'.encode("utf-16-le", "surrogatepass"), "invalid_unicode", "a"),
        (b'{"a": [{"b": ' * 33 + b"1" + b"}]}" * 33, "json_too_deep", None),
    ],
)
def test_parse_json__rejects(body: bytes, code: str, field: str | None):
    with pytest.raises(BadJson) as caught:
        parse_json(body, max_depth=64)
    assert caught.value.code == code
    if field is not None:
        assert caught.value.field == field


def test_parse_json__a_body_too_deep_without_escapes_names_the_field_as_the_full_walk():
    body = b'{"a": [{"b": ' * 33 + b"1" + b"}]}" * 33
    with pytest.raises(BadJson) as fast:
        parse_json(body, max_depth=64)
    with pytest.raises(BadJson) as full:
        check_json(json.loads(body), max_depth=64)
    assert fast.value.field == full.value.field
    assert fast.value.field is not None and fast.value.field.startswith("a[0].b.a[0].b")


def test_parse_json__accepts_depth_64_and_plain_documents():
    assert parse_json(b"[" * 64 + b"]" * 64, max_depth=64) is not None
    assert parse_json(b'{"tool": "echo", "input": {"n": 1.5, "s": "\\u00e9"}}', 64) == {
        "tool": "echo",
        "input": {"n": 1.5, "s": "é"},
    }
    hangul = '{"s": ["한국어", {"k": "é"}]}'
    assert parse_json(hangul.encode(), 64) == {"s": ["한국어", {"k": "é"}]}


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/merge-patch+json", True),
        ("text/json", False),
        ("text/plain", False),
        ("", False),
        ("multipart/form-data; boundary=x", False),
    ],
)
def test_is_json_media_type(content_type: str, ok: bool):
    assert is_json_media_type(content_type) is ok
