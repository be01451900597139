"""Mounting the MCP server at ``/mcp``: a Bearer key authenticates every request (as for the
REST API). The SDK is loaded on the first authenticated request, not at the API's start (its
import is about a second of CPU that a process serving no MCP client never needs), and its
sessions live until the app stops."""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from fastapi import FastAPI
from fastapi.security import HTTPAuthorizationCredentials
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from api.deps import Services, get_principal
from api.problems import Problem, problem_response
from runyard.sandboxes.files import SandboxFiles

if TYPE_CHECKING:
    from api.mcp.providers import ToolProvider
    from api.mcp.session import McpSessions

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
# The modules that import the SDK, loaded on first use.
SDK_MODULES = ("api.mcp.session", "api.mcp.providers")


def import_sdk() -> None:
    """Import the SDK's side of ``/mcp`` (run in a thread: the event loop serves meanwhile)."""
    for name in SDK_MODULES:
        importlib.import_module(name)


class McpLoad:
    """One lifespan's MCP sessions: loaded when the first request wants them, ended with the
    app. ``run`` is the task that loads and then holds them."""

    def __init__(self, open_sessions: Callable[[], McpSessions]) -> None:
        self.sessions: McpSessions | None = None
        self._open = open_sessions
        self._wanted = anyio.Event()
        self._settled = anyio.Event()
        self._ended = anyio.Event()

    async def run(self) -> None:
        """Wait until a request wants the sessions, load the SDK, serve until ``end``."""
        await self._wanted.wait()
        try:
            if self._ended.is_set():
                return
            await anyio.to_thread.run_sync(import_sdk)
            if self._ended.is_set():
                return
            sessions = self._open()
            async with sessions.run():
                self.sessions = sessions
                self._settled.set()
                try:
                    await self._ended.wait()
                finally:
                    self.sessions = None
        except Exception:
            # The REST routes serve on: only /mcp is lost (503), and the log says why.
            logger.exception("mcp: the SDK or its server failed; /mcp answers 503")
        finally:
            self._settled.set()

    async def ready(self) -> McpSessions | None:
        """The sessions, loaded now if they were not; None when they cannot be (the SDK
        failed to load, or the app is stopping)."""
        self._wanted.set()
        await self._settled.wait()
        return None if self._ended.is_set() else self.sessions

    def end(self) -> None:
        """The app stops: end the sessions, and answer requests still waiting for them."""
        self._ended.set()
        self._wanted.set()
        self._settled.set()


class McpEndpoint:
    """The ASGI endpoint at ``/mcp``: authenticate, then hand the request to the SDK."""

    def __init__(self) -> None:
        self.load: McpLoad | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        load = self.load
        if load is None:
            await problem_response(503, "starting", "the API is starting")(scope, receive, send)
            return
        services: Services = scope["app"].state.services
        try:
            principal = await get_principal(services, _credentials(scope))
        except Problem as problem:
            response = problem_response(
                problem.status, problem.code, problem.detail, headers=problem.headers
            )
            await response(scope, receive, send)
            return
        sessions = await load.ready()
        if sessions is None:
            response = problem_response(
                503,
                "mcp_unavailable",
                "the MCP server is unavailable: the API is stopping, or the MCP SDK or its "
                "server failed (the API's log says why)",
            )
            await response(scope, receive, send)
            return
        await sessions.handle(scope, receive, send, principal)


def _credentials(scope: Scope) -> HTTPAuthorizationCredentials | None:
    """The Bearer credentials of the request, if it sent any."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)
    return None


def _open_sessions(
    services: Services,
    app: Any,
    providers: Callable[[Services], list[ToolProvider]] | None,
) -> McpSessions:
    """The sessions over ``providers`` (the API's own if None, sandbox files through the
    app's engine, made on first use as for the REST file routes)."""
    from api.mcp.providers import default_providers
    from api.mcp.session import McpSessions

    if providers is None:
        made = default_providers(services, lambda: SandboxFiles(app.state.sandbox_engine()))
    else:
        made = providers(services)
    return McpSessions(services, made)


def install_mcp(
    app: FastAPI,
    providers: Callable[[Services], list[ToolProvider]] | None = None,
) -> None:
    """Serve MCP at ``/mcp`` (outside the OpenAPI document): its sessions start on the first
    request after the app's services and stop before them. ``providers`` makes the tool
    providers from the services (``default_providers`` if None, sandbox files through the
    app's ``sandbox_engine``)."""
    endpoint = McpEndpoint()
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint, include_in_schema=False))
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with inner(app_) as state:
            load = McpLoad(functools.partial(_open_sessions, app_.state.services, app_, providers))
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(load.run)
                endpoint.load = load
                try:
                    yield state
                finally:
                    endpoint.load = None
                    load.end()

    app.router.lifespan_context = lifespan
