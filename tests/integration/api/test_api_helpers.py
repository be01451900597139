"""Helpers shared by the API tests: apps, keys, a live server on loopback, waiting on
conditions. (No tests here; the name keeps it with the API test modules.)"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine, text

from api.main import create_app
from api.serving import QuietServer
from runyard.platform.settings import Settings
from runyard.registry.tools import ToolRegistry
from runyard.runner import Runner
from runyard.tenancy.auth import create_api_key


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for a test app: the test's database, short timings."""
    values: dict[str, Any] = {"database_url": database_url, "events_poll_seconds": 0.5}
    values.update(overrides)
    return Settings(**values)


def make_app(
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    runner: Runner | None = None,
    **overrides: Any,
) -> FastAPI:
    """An app on the test's database and engine."""
    settings = make_settings(database_url, **overrides)
    return create_app(settings, engine=engine, registry=registry, runner=runner)


def bearer(engine: Engine, tenant: str, *, admin: bool = False) -> dict[str, str]:
    """Headers with a fresh API key of ``tenant``."""
    return {"Authorization": f"Bearer {create_api_key(engine, tenant, admin=admin)}"}


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def run_status(engine: Engine, run_id: str | uuid.UUID) -> str | None:
    """The run's status straight from the database."""
    with engine.connect() as conn:
        value = conn.execute(
            text("SELECT CAST(status AS text) FROM tool_runs WHERE id = :id"), {"id": run_id}
        ).scalar_one_or_none()
    return None if value is None else str(value)


def count(engine: Engine, sql: str, **params: Any) -> int:
    """A ``SELECT count(*) ...`` straight from the database."""
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


@contextmanager
def served_in_thread(server: uvicorn.Server) -> Iterator[tuple[str, threading.Thread]]:
    """Run ``server`` (on a loopback port) in a thread until the block ends; yields its URL
    and the thread."""
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=20)
    assert server.started, "the test server did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", thread
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port) in a thread; yields its URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
    )
    with served_in_thread(QuietServer(config)) as (url, thread):
        yield url
    assert not thread.is_alive(), "the test server did not stop"
