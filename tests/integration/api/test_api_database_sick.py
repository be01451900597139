"""A sick database answers 503 problem+json with Retry-After on every route, never a hang or
a 500; waits and event streams outlive the statement timeout."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from httpx2 import Response
from sqlalchemy import Engine, event, text

from api.main import create_app
from runyard.platform.db import DbTimeouts, make_engine
from runyard.platform.settings import Settings
from runyard.registry.tools import ToolRegistry
from tests.integration.api.test_api_helpers import bearer, make_app, make_settings

RETRY_AFTER = 7
SICK: dict[str, Any] = {"db_retry_after_seconds": RETRY_AFTER}


def assert_database_unavailable(response: Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["retry-after"] == str(RETRY_AFTER)
    assert response.json()["code"] == "database_unavailable"


def every_kind_of_route(client: TestClient, headers: dict[str, str]) -> list[Response]:
    return [
        client.get("/readyz"),
        client.get("/v1/runs", headers=headers),
        client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=headers),
        client.get("/v1/tools", headers=headers),
    ]


def test_api__unreachable_database_answers_503_everywhere(registry: ToolRegistry):
    url = "postgresql://nobody@127.0.0.1:9/none"  # a loopback port nobody listens on
    dead = make_engine(url, pool_size=1, max_overflow=0)
    app = create_app(Settings(database_url=url, **SICK), engine=dead, registry=registry)
    with TestClient(app) as client:
        for response in every_kind_of_route(client, {"Authorization": "Bearer ry_x_y"}):
            assert_database_unavailable(response)
    dead.dispose()


@pytest.fixture
def closing(database_url: str) -> Iterator[tuple[Engine, threading.Event]]:
    """An engine whose connections, once the event is set, turn out closed under the driver
    (what psycopg reports as InterfaceError)."""
    eng = make_engine(database_url, pool_size=2, max_overflow=0)
    broken = threading.Event()

    def on_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        if broken.is_set():
            raise psycopg.InterfaceError("the connection is closed")

    event.listen(eng, "checkout", on_checkout)
    yield eng, broken
    eng.dispose()


def test_api__interface_error_answers_503_not_500(
    database_url: str,
    registry: ToolRegistry,
    engine: Engine,
    closing: tuple[Engine, threading.Event],
):
    acme = bearer(engine, "acme")
    eng, broken = closing
    app = make_app(database_url, eng, registry, **SICK)
    with TestClient(app) as client:
        assert client.get("/v1/runs", headers=acme).status_code == 200
        broken.set()
        for response in every_kind_of_route(client, bearer(engine, "other")):
            assert_database_unavailable(response)


def test_api__exhausted_pool_answers_503(database_url: str, registry: ToolRegistry, engine: Engine):
    acme = bearer(engine, "acme")
    small = make_engine(
        database_url, pool_size=1, max_overflow=0, timeouts=DbTimeouts(pool_seconds=0.2)
    )
    app = make_app(database_url, small, registry, **SICK)
    with TestClient(app) as client, small.connect():  # the pool's only connection, held
        for response in every_kind_of_route(client, acme):
            assert_database_unavailable(response)
    small.dispose()


def test_api__lock_timeout_of_its_own_engine_answers_503(
    database_url: str, registry: ToolRegistry, engine: Engine
):
    acme = bearer(engine, "acme")
    settings = make_settings(
        database_url, db_statement_timeout_seconds=2, db_lock_timeout_seconds=0.3, **SICK
    )
    app = create_app(settings, registry=registry)  # the engine built from the settings
    with TestClient(app) as client, engine.begin() as holder:
        # A migration, say, holding the keys table: requests give up instead of piling up.
        holder.execute(text("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE"))
        assert_database_unavailable(client.get("/v1/runs", headers=acme))


def test_api__a_bug_is_still_a_500_without_retry_after(
    database_url: str, registry: ToolRegistry, engine: Engine
):
    acme = bearer(engine, "acme")
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE tool_runs RENAME TO tool_runs_gone"))
    app = make_app(database_url, engine, registry, **SICK)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/v1/runs", headers=acme)
    assert response.status_code == 500
    assert response.json()["code"] == "internal_error"
    assert "retry-after" not in response.headers


@pytest.mark.slow  # a 2.5 s wait and a 2.5 s stream, by design
def test_api__waits_and_streams_outlive_the_statement_timeout(
    database_url: str, registry: ToolRegistry, engine: Engine
):
    acme = bearer(engine, "acme")
    settings = make_settings(
        database_url,
        db_statement_timeout_seconds=1,
        db_lock_timeout_seconds=0.5,
        events_max_stream_seconds=2.5,
    )
    with TestClient(create_app(settings, registry=registry)) as client:
        waited = client.post(
            "/v1/runs", params={"wait": 2.5}, json={"tool": "echo", "input": {}}, headers=acme
        )
        assert waited.status_code == 202, waited.text  # no worker: still queued after the wait
        run: dict[str, Any] = waited.json()
        assert run["status"] == "queued"
        stream = client.get(f"/v1/runs/{run['id']}/events", headers=acme)
        assert stream.status_code == 200
        assert '"status": "queued"' in stream.text  # then it ended at its bound, cleanly
