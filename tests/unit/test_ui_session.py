"""Dashboard session cookies and the template filters (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from api.ui.render import duration, relative, seconds, when
from api.ui.session import SessionSigner, key_prefix, same_token

SECRET = b"s" * 32


def test_signer__round_trips_and_gives_a_stable_csrf_token_per_cookie():
    signer = SessionSigner(SECRET, lifetime_seconds=60)
    cookie = signer.issue("abc123", now=1000)
    opened = signer.open(cookie, now=1030)
    assert opened is not None
    prefix, token = opened
    assert prefix == "abc123"
    assert signer.open(cookie, now=1031) == (prefix, token)
    other = signer.open(signer.issue("abc123", now=1000), now=1030)
    assert other is not None and other[1] != token  # a new login, a new token


def test_signer__refuses_expired_tampered_foreign_and_malformed_cookies():
    signer = SessionSigner(SECRET, lifetime_seconds=60)
    cookie = signer.issue("abc123", now=1000)
    assert signer.open(cookie, now=1060) is None  # expired
    version, payload, mac = cookie.split(".")
    forged_payload = payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB")
    assert signer.open(f"{version}.{forged_payload}.{mac}", now=1001) is None
    assert signer.open(f"v2.{payload}.{mac}", now=1001) is None
    assert SessionSigner(b"t" * 32, lifetime_seconds=60).open(cookie, now=1001) is None
    for junk in ("", "v1", "v1..", "v1.a.b.c", "v1.!!!.x"):
        assert signer.open(junk, now=1001) is None


def test_signer__needs_a_long_secret():
    with pytest.raises(ValueError, match="32 bytes"):
        SessionSigner(b"short", lifetime_seconds=60)


def test_key_prefix__only_of_well_formed_keys():
    assert key_prefix("ry_abc_secret_with_underscores") == "abc"
    for bad in ("", "ry_", "ry__secret", "xx_abc_secret", "ry_abc"):
        assert key_prefix(bad) is None


def test_same_token__compares_and_rejects_missing():
    assert same_token("abc", "abc")
    assert not same_token("abd", "abc")
    assert not same_token(None, "abc")


def test_filters__relative_absolute_duration_seconds():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert relative(now - timedelta(seconds=5), now) == "5 s ago"
    assert relative(now - timedelta(minutes=3, seconds=59), now) == "3 min ago"
    assert relative(now - timedelta(hours=2), now) == "2 h ago"
    assert relative(now + timedelta(days=3), now) == "in 3 d"
    assert duration(now, now + timedelta(seconds=1.234)) == "1.23 s"
    assert duration(now, now + timedelta(seconds=185)) == "3 min 5 s"
    assert duration(now, now + timedelta(hours=2, minutes=7)) == "2 h 7 min"
    assert duration(now, None) == "—"
    assert seconds(0.071) == "71 ms" and seconds(2.5) == "2.5 s" and seconds(None) == "—"
    html = str(when(now))
    assert '<time datetime="2026-11-26T12:00:00+00:00">2026-11-26 12:00:00 UTC</time>' in html
    assert 'data-since="2026-11-26T12:00:00+00:00"' in html
