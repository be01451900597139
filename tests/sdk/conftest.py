"""Fixtures of the SDK tests: every scenario runs with both flavours (``Runyard``,
``AsyncRunyard``) against both backends (the in-memory fake of ``runyard_client.testing``, and
the real API on loopback with a worker), through a transport that records and injects faults."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from anyio.from_thread import start_blocking_portal

from runyard_client import AsyncRunyard, Runyard
from runyard_client.testing import FAKE_URL, FakeBackend, fake_transport
from tests.sdk.harness import AsyncFaultyTransport, Blocking, Faults, FaultyTransport, live_backend
from tests.sdk.tools import TOOLS


@dataclass
class Yard:
    """A client of one flavour (the async one behind ``Blocking``) against one backend."""

    client: Any
    faults: Faults
    kind: str
    flavour: str


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["fake", "live"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_yard(
    request: pytest.FixtureRequest, flavour: str, backend_kind: str
) -> Iterator[Callable[..., Yard]]:
    """Opens a yard; ``max_queued`` caps the tenant's queued runs on either backend; ``admin``
    gives the live backend's client an admin key."""
    if backend_kind == "live":
        # Set up before this fixture, so torn down after the API and worker it serves.
        database_url = request.getfixturevalue("database_url")
        engine = request.getfixturevalue("engine")
    with contextlib.ExitStack() as stack:

        def open_one(*, max_queued: int = 0, max_retries: int = 3, admin: bool = False) -> Yard:
            faults = Faults()
            if backend_kind == "fake":
                backend = FakeBackend(TOOLS, max_queued=max_queued)
                url, key = FAKE_URL, None
                sync_inner: httpx2.BaseTransport = fake_transport(backend)
                async_inner: httpx2.AsyncBaseTransport = fake_transport(backend)
            else:
                url, key = stack.enter_context(
                    live_backend(database_url, engine, admin=admin, tenant_max_queued=max_queued)
                )
                sync_inner, async_inner = httpx2.HTTPTransport(), httpx2.AsyncHTTPTransport()
            if flavour == "sync":
                transport = FaultyTransport(sync_inner, faults)
                client: Any = Runyard(url, key, max_retries=max_retries, transport=transport)
                stack.callback(client.close)
            else:
                portal = stack.enter_context(start_blocking_portal())
                async_transport = AsyncFaultyTransport(async_inner, faults)
                async_client = AsyncRunyard(
                    url, key, max_retries=max_retries, transport=async_transport
                )
                client = Blocking(async_client, portal)
                stack.callback(client.close)
            return Yard(client, faults, backend_kind, flavour)

        yield open_one


@pytest.fixture
def yard(open_yard: Callable[..., Yard]) -> Yard:
    """A yard with the defaults."""
    return open_yard()
