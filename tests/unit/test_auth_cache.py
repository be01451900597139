"""The API key cache: bounded in time and in size, never holding the secret."""

from __future__ import annotations

from runyard.tenancy.auth import Principal, PrincipalCache


def test_principal_cache__expires_after_its_ttl():
    now = [0.0]
    cache = PrincipalCache(ttl_seconds=5.0, clock=lambda: now[0])
    cache.put("ry_a_secret", Principal("acme"))
    assert cache.get("ry_a_secret") == Principal("acme")
    now[0] = 4.99
    assert cache.get("ry_a_secret") == Principal("acme")
    now[0] = 5.0
    assert cache.get("ry_a_secret") is None
    assert cache.get("ry_a_other") is None


def test_principal_cache__bounded_and_keyed_by_hash():
    now = [0.0]
    cache = PrincipalCache(ttl_seconds=5.0, max_keys=3, clock=lambda: now[0])
    for i in range(10):
        cache.put(f"ry_p_secret{i}", Principal(f"t{i}"))
    assert len(cache._entries) == 3
    assert cache.get("ry_p_secret9") == Principal("t9")
    assert cache.get("ry_p_secret0") is None
    assert not any("secret" in key for key in cache._entries)


def test_principal_cache__zero_ttl_disables_it():
    cache = PrincipalCache(ttl_seconds=0)
    cache.put("ry_a_b", Principal("acme"))
    assert cache.get("ry_a_b") is None
