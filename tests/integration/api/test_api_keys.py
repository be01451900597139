"""API keys end to end: create, use, list, revoke, refused; last use; the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from api.deps import Services
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import PrincipalCache, authenticate, create_api_key
from runyard.tenancy.keys import list_keys, prefix_of, revoke_key
from tests.integration.api.test_api_helpers import bearer, make_app

CLI = [sys.executable, "-m", "runyard.cli"]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _last_used(engine: Engine, prefix: str) -> datetime | None:
    with engine.connect() as conn:
        value = conn.execute(
            text("SELECT last_used_at FROM api_keys WHERE prefix = :p"), {"p": prefix}
        ).scalar_one()
    return value  # type: ignore[no-any-return]


def test_keys_api__create_use_list_revoke_refused(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    admin = bearer(engine, "ops", admin=True)
    with TestClient(make_app(database_url, engine, registry)) as client:
        created = client.post("/v1/keys", json={"tenant": "acme", "name": "ci"}, headers=admin)
        assert created.status_code == 201, created.text
        body = created.json()
        key, prefix = body["key"], body["prefix"]
        assert key.startswith(f"ry_{prefix}_") and body["tenant"] == "acme"
        assert body["scopes"] == [] and body["last_used_at"] is None
        assert "key_hash" not in body

        assert client.get("/v1/runs", headers=_auth(key)).status_code == 200

        listed = client.get("/v1/keys", headers=admin)
        assert listed.status_code == 200
        [entry] = [k for k in listed.json() if k["prefix"] == prefix]
        assert entry["tenant"] == "acme" and entry["name"] == "ci" and entry["scopes"] == []
        assert entry["created_at"] == body["created_at"]
        assert entry["last_used_at"] is not None and entry["revoked_at"] is None
        assert set(entry) == {
            "prefix",
            "tenant",
            "name",
            "scopes",
            "max_priority",
            "tools",
            "created_at",
            "last_used_at",
            "revoked_at",
        }
        assert key.split("_", 2)[2] not in listed.text
        only_acme = client.get("/v1/keys", params={"tenant": "acme"}, headers=admin).json()
        assert [k["prefix"] for k in only_acme] == [prefix]

        # A tenant's key may not manage keys, not even its own.
        for method, path in [
            ("GET", "/v1/keys"),
            ("POST", "/v1/keys"),
            ("DELETE", f"/v1/keys/{prefix}"),
        ]:
            body = {"tenant": "acme"} if method == "POST" else None
            answer = client.request(method, path, headers=_auth(key), json=body)
            assert answer.status_code == 403, (method, answer.text)
            assert answer.json()["code"] == "forbidden"

        assert client.delete(f"/v1/keys/{prefix}", headers=admin).status_code == 204
        refused = client.get("/v1/runs", headers=_auth(key))
        assert refused.status_code == 401 and refused.json()["code"] == "invalid_api_key"
        assert client.delete(f"/v1/keys/{prefix}", headers=admin).status_code == 204
        assert client.delete("/v1/keys/0123456789ab", headers=admin).status_code == 404
        assert client.delete("/v1/keys/not-a-prefix", headers=admin).status_code == 404

        live = client.get("/v1/keys", headers=admin).json()
        assert prefix not in [k["prefix"] for k in live]
        every = client.get("/v1/keys", params={"include_revoked": "true"}, headers=admin).json()
        [gone] = [k for k in every if k["prefix"] == prefix]
        assert gone["revoked_at"] is not None


def test_keys_api__an_admin_key_is_created_with_the_admin_scope(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    admin = bearer(engine, "ops", admin=True)
    with TestClient(make_app(database_url, engine, registry)) as client:
        created = client.post("/v1/keys", json={"tenant": "ops", "admin": True}, headers=admin)
        assert created.status_code == 201 and created.json()["scopes"] == ["admin"]
        second = _auth(created.json()["key"])
        assert client.get("/v1/keys", headers=second).status_code == 200


def test_revoke__another_api_process_refuses_the_key_after_its_cache_time(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    """The revoke goes through one process; another, which verified the key a moment
    before, trusts its cache for at most AUTH_CACHE_SECONDS more."""
    admin = bearer(engine, "ops", admin=True)
    key = create_api_key(engine, "acme")
    prefix = prefix_of(key)
    assert prefix is not None
    clock = [1000.0]
    with (
        TestClient(make_app(database_url, engine, registry)) as first,
        TestClient(make_app(database_url, engine, registry)) as second,
    ):
        services: Services = second.app.state.services  # type: ignore[attr-defined]
        services.auth_cache = PrincipalCache(ttl_seconds=5.0, clock=lambda: clock[0])
        assert second.get("/v1/runs", headers=_auth(key)).status_code == 200
        assert first.delete(f"/v1/keys/{prefix}", headers=admin).status_code == 204
        clock[0] += 4.9
        assert second.get("/v1/runs", headers=_auth(key)).status_code == 200  # cached
        clock[0] += 0.1
        assert second.get("/v1/runs", headers=_auth(key)).status_code == 401


def test_authenticate__writes_last_used_at_at_most_once_a_minute(engine: Engine):
    key = create_api_key(engine, "acme")
    prefix = prefix_of(key)
    assert prefix is not None
    start = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    assert authenticate(engine, key, now=start) is not None
    assert _last_used(engine, prefix) == start
    for seconds in (1, 30, 59):
        assert authenticate(engine, key, now=start + timedelta(seconds=seconds)) is not None
        assert _last_used(engine, prefix) == start
    later = start + timedelta(seconds=60)
    assert authenticate(engine, key, now=later) is not None
    assert _last_used(engine, prefix) == later
    # A wrong secret with the right prefix is no use, and writes nothing.
    wrong = key[:-4] + "AAAA" if not key.endswith("AAAA") else key[:-4] + "BBBB"
    assert authenticate(engine, wrong, now=later + timedelta(hours=1)) is None
    assert _last_used(engine, prefix) == later


def test_revoke_key__keeps_the_first_time_and_knows_unknown_keys(engine: Engine):
    key = create_api_key(engine, "acme")
    prefix = prefix_of(key)
    assert prefix is not None
    first = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    assert revoke_key(engine, prefix, now=first) == first
    assert revoke_key(engine, prefix, now=first + timedelta(hours=1)) == first
    assert revoke_key(engine, "0123456789ab") is None
    assert authenticate(engine, key) is None
    assert [k.prefix for k in list_keys(engine, include_revoked=True)] == [prefix]
    assert list_keys(engine) == []


@pytest.mark.slow  # starts the CLI twelve times
@pytest.mark.slow  # a CLI command in a process of its own per step
def test_cli_keys__create_ls_revoke_against_the_database(database_url: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    env["RUNYARD_DATABASE_URL"] = database_url

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "keys", *args], env=env, capture_output=True, text=True, timeout=60
        )

    created = cli("create", "--tenant", "acme", "--name", "ci", "--max-priority", "5")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    prefix = prefix_of(key)
    assert prefix is not None

    listed = cli("ls")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:5] == ["PREFIX", "TENANT", "SCOPES", "MAX", "PRIO"]
    assert row.split()[:4] == [prefix, "acme", "-", "5"] and row.split()[5] == "never"
    raised = cli("set-priority", prefix, "20")
    assert raised.returncode == 0 and "max_priority 20" in raised.stderr, raised.stderr
    assert cli("ls").stdout.splitlines()[1].split()[3] == "20"
    assert cli("set-priority", "0123456789ab", "1").returncode == 1
    assert key.split("_", 2)[2] not in listed.stdout
    [entry] = json.loads(cli("ls", "--json").stdout)
    assert entry["prefix"] == prefix and entry["tenant"] == "acme"
    assert "key_hash" not in entry

    revoked = cli("revoke", key)  # the whole key names it as well as its prefix
    assert revoked.returncode == 0, revoked.stderr
    assert f"key {prefix} revoked at" in revoked.stderr
    assert cli("ls").stdout.splitlines()[1:] == []
    assert "revoked" in cli("ls", "--all").stdout
    assert cli("revoke", "0123456789ab").returncode == 1
    assert cli("revoke", "nonsense").returncode == 2
