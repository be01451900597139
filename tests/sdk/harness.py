"""The SDK scenarios' harness: a transport in front of either backend that records requests
and injects faults, the async client driven from plain test code, and the live backend (the
API on loopback with a worker whose fake runner calls the scenario tools)."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from anyio.from_thread import BlockingPortal
from sqlalchemy import Engine

from runyard.artifact_stores.postgres import PostgresArtifactStore
from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.registry.tools import load_registry
from runyard.runners.fake import FakeRunner
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import live_server, make_app
from tests.sdk.tools import live_handler
from worker.service import Worker, WorkerConfig

HERE = Path(__file__).resolve().parent


@dataclass
class Canned:
    """An answer given instead of the backend's to the next ``times`` matching requests."""

    method: str
    path_prefix: str
    status: int  # 0: the connection fails instead
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Faults:
    """What the transport does besides forwarding: canned answers, event streams cut after
    ``cut_events_after`` messages, artifact bodies with a byte flipped; every request seen."""

    requests: list[httpx2.Request] = field(default_factory=list)
    canned: list[Canned] = field(default_factory=list)
    cut_events_after: int | None = None
    corrupt_artifacts: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self, method: str, path_prefix: str) -> list[httpx2.Request]:
        """The requests of ``method`` whose path starts with ``path_prefix``."""
        return [
            r for r in self.requests if r.method == method and r.url.path.startswith(path_prefix)
        ]

    def before(self, request: httpx2.Request) -> httpx2.Response | None:
        """Record the request; the canned answer for it, if any (or raise a connect error)."""
        with self.lock:
            self.requests.append(request)
            for canned in self.canned:
                if (
                    canned.times > 0
                    and request.method == canned.method
                    and request.url.path.startswith(canned.path_prefix)
                ):
                    canned.times -= 1
                    if canned.status == 0:
                        raise httpx2.ConnectError("connection refused (injected)", request=request)
                    body = (
                        b'{"type":"about:blank","title":"x","status":%d,"code":"injected",'
                        % (canned.status)
                        + b'"detail":"injected failure"}'
                    )
                    headers = {"content-type": "application/problem+json", **canned.headers}
                    return httpx2.Response(canned.status, content=body, headers=headers)
        return None

    def rewrites(self, request: httpx2.Request, response: httpx2.Response) -> str | None:
        """How the body of this answer is damaged: ``cut``, ``flip`` or not at all."""
        if response.status_code not in (200, 206):
            return None
        if self.cut_events_after is not None and request.url.path.endswith("/events"):
            return "cut"
        if self.corrupt_artifacts and "/artifacts/" in request.url.path:
            return "flip"
        return None


class _Damage:
    """Cuts an event stream after its N-th message (the connection drops there), or flips
    the first byte of a body."""

    def __init__(self, how: str, limit: int | None) -> None:
        self.how, self.limit, self.messages, self.flipped = how, limit or 0, 0, False

    def piece(self, chunk: bytes) -> tuple[bytes, bool]:
        """What of ``chunk`` gets through, and whether the connection drops after it."""
        if self.how == "flip":
            if self.flipped or not chunk:
                return chunk, False
            self.flipped = True
            return bytes([chunk[0] ^ 0xFF]) + chunk[1:], False
        start = 0
        while (end := chunk.find(b"\n\n", start)) >= 0:
            block = chunk[start:end]
            start = end + 2
            if block.startswith(b"id: ") or b"\nid: " in block:
                self.messages += 1
                if self.messages >= self.limit:
                    return chunk[:start], True
        return chunk, False


def _dropped() -> httpx2.ReadError:
    return httpx2.ReadError("connection dropped (injected)")


class FaultyTransport(httpx2.BaseTransport):
    """``Faults`` in front of a blocking transport."""

    def __init__(self, inner: httpx2.BaseTransport, faults: Faults) -> None:
        self.inner, self.faults = inner, faults

    def close(self) -> None:
        self.inner.close()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        canned = self.faults.before(request)
        if canned is not None:
            return canned
        response = self.inner.handle_request(request)
        how = self.faults.rewrites(request, response)
        if how is None:
            return response
        damage = _Damage(how, self.faults.cut_events_after)
        stream = response.stream
        assert isinstance(stream, httpx2.SyncByteStream)

        def pieces() -> Iterator[bytes]:
            try:
                for chunk in stream:
                    data, drop = damage.piece(chunk)
                    yield data
                    if drop:
                        raise _dropped()
            finally:
                stream.close()

        return httpx2.Response(
            response.status_code, headers=response.headers, stream=_SyncStream(pieces())
        )


class _SyncStream(httpx2.SyncByteStream):
    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        return self._pieces


class AsyncFaultyTransport(httpx2.AsyncBaseTransport):
    """``Faults`` in front of an async transport."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, faults: Faults) -> None:
        self.inner, self.faults = inner, faults

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        canned = self.faults.before(request)
        if canned is not None:
            return canned
        response = await self.inner.handle_async_request(request)
        how = self.faults.rewrites(request, response)
        if how is None:
            return response
        damage = _Damage(how, self.faults.cut_events_after)
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)

        async def pieces() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    data, drop = damage.piece(chunk)
                    yield data
                    if drop:
                        raise _dropped()
            finally:
                await stream.aclose()

        return httpx2.Response(
            response.status_code, headers=response.headers, stream=_AsyncStream(pieces())
        )


class _AsyncStream(httpx2.AsyncByteStream):
    def __init__(self, pieces: AsyncIterator[bytes]) -> None:
        self._pieces = pieces

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces


class Blocking:
    """An ``AsyncRunyard`` driven from plain test code: each coroutine runs on the portal's
    event loop, each async iterator is walked one ``__anext__`` at a time, so the scenarios
    are written once for both flavours."""

    def __init__(self, client: Any, portal: BlockingPortal) -> None:
        self._client, self._portal = client, portal

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            if inspect.iscoroutine(result):
                return self._portal.call(_awaited, result)
            if hasattr(result, "__anext__"):
                return self._walk(result)
            return result

        return call

    def _walk(self, iterator: Any) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._portal.call(iterator.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            if hasattr(iterator, "aclose"):
                self._portal.call(iterator.aclose)


async def _awaited(coroutine: Any) -> Any:
    return await coroutine


@contextlib.contextmanager
def live_backend(
    database_url: str, engine: Engine, *, admin: bool = False, **settings: Any
) -> Iterator[tuple[str, str]]:
    """The API on loopback (queue mode, waits capped at one second so long-polls come in
    slices) and a worker whose fake runner runs the scenario tools; yields (url, api key of
    tenant acme, an admin's if ``admin``)."""
    registry = load_registry(HERE / "tools.toml", Settings(database_url="unused"))
    app = make_app(
        database_url, engine, registry, max_wait_seconds=1.0, events_poll_seconds=0.2, **settings
    )
    queue = JobQueue(engine)
    config = WorkerConfig(worker_id="w-sdk", concurrency=2, poll_seconds=0.05)
    worker = Worker(
        queue, FakeRunner(live_handler), config, artifacts=PostgresArtifactStore(engine)
    )
    thread = threading.Thread(target=worker.run_forever, name="sdk-worker", daemon=True)
    thread.start()
    try:
        with live_server(app) as url:
            yield url, create_api_key(engine, "acme", admin=admin)
    finally:
        worker.stop()
        thread.join(timeout=20)
        worker.close()


Factory = Callable[..., Any]
