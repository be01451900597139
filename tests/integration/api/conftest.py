"""Fixtures of the API tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.cli_support import Api, RecordRequests
from tests.integration.api.test_api_helpers import live_server, make_app


@pytest.fixture
def api(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[Api]:
    """The API on loopback with queue mode, no worker, and waits capped at one second (so
    a CLI wait of a few seconds needs several long-polls)."""
    app = make_app(database_url, engine, registry, max_wait_seconds=1.0)
    served = Api("", create_api_key(engine, "acme"), engine, JobQueue(engine))
    app.add_middleware(RecordRequests, log=served.requests)
    with live_server(app) as url:
        served.url = url
        yield served
