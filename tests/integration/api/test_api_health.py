"""Liveness and readiness never wait behind request work: every thread of the shared pool
busy, or a database that never answers, and both still answer at once or within their bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, make_url

from api.routes.health import READY_TIMEOUT_SECONDS
from runyard.platform.db import make_engine
from runyard.registry.tools import ToolRegistry
from tests.integration.api.test_api_helpers import bearer, make_app
from tests.tcp_proxy import BlackHoleProxy


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry)) as test_client:
        yield test_client


class SharedThreadsTaken:
    """Holds every token of the app's shared thread pool (where plain ``def`` routes and
    dependencies run) until ``release``, as requests stuck on slow work would."""

    def __init__(self, client: TestClient) -> None:
        self._client = client
        self._release = threading.Event()
        self._held = threading.Event()

    async def _hold(self) -> None:
        limiter = anyio.to_thread.current_default_thread_limiter()
        borrowers = [object() for _ in range(int(limiter.total_tokens))]
        for borrower in borrowers:
            await limiter.acquire_on_behalf_of(borrower)
        self._held.set()
        try:
            while not self._release.is_set():
                await anyio.sleep(0.01)
        finally:
            for borrower in borrowers:
                limiter.release_on_behalf_of(borrower)

    def __enter__(self) -> SharedThreadsTaken:
        assert self._client.portal is not None
        self._future = self._client.portal.start_task_soon(self._hold)
        assert self._held.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._future.result(timeout=10)


def test_health__both_answer_while_every_request_thread_is_busy(client: TestClient, engine: Engine):
    acme = bearer(engine, "acme")
    stuck: dict[str, Any] = {}
    with SharedThreadsTaken(client):
        # A route that needs a shared thread waits: the pool is really full.
        waiting = threading.Thread(
            target=lambda: stuck.setdefault("tools", client.get("/v1/tools", headers=acme))
        )
        waiting.start()
        started = time.monotonic()
        live = client.get("/healthz")
        ready = client.get("/readyz")
        elapsed = time.monotonic() - started
        assert (live.status_code, ready.status_code) == (200, 200), ready.text
        assert ready.json()["status"] == "ready"
        assert elapsed < READY_TIMEOUT_SECONDS
        assert "tools" not in stuck  # still waiting for a thread
    waiting.join(timeout=30)
    assert stuck["tools"].status_code == 200


@pytest.mark.slow  # sits out the 3 s readiness bound four times
def test_readyz__a_database_that_never_answers_is_503_within_its_bound(
    database_url: str, registry: ToolRegistry
):
    target = make_url(database_url)
    assert target.host is not None and target.port is not None
    proxy = BlackHoleProxy(target.host, target.port)
    silent = make_engine(
        target.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False),
        pool_size=1,
        max_overflow=0,
    )
    app = make_app(database_url, silent, registry)
    try:
        with TestClient(app) as client:
            assert client.get("/readyz").status_code == 200  # through the proxy, at first
            proxy.black_hole()
            for _ in range(4):  # more probes than readiness has threads: none hangs
                started = time.monotonic()
                response = client.get("/readyz")
                assert time.monotonic() - started < READY_TIMEOUT_SECONDS + 5
                assert response.status_code == 503
                assert response.json()["code"] == "database_unavailable"
                assert "Retry-After" in response.headers
            assert client.get("/healthz").status_code == 200
    finally:
        proxy.close()
        silent.dispose()
