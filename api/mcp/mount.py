"""Mounting the MCP server at ``/mcp``: a Bearer key authenticates every request (as for the
REST API), and the SDK's session manager lives as long as the app."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.security import HTTPAuthorizationCredentials
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from api.deps import Services, get_principal
from api.mcp.providers import ToolProvider, default_providers
from api.mcp.server import PRINCIPAL_SCOPE_KEY, build_server
from api.problems import Problem, problem_response
from runyard.sandboxes.files import SandboxFiles

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"


class McpEndpoint:
    """The ASGI endpoint at ``/mcp``: authenticate, then hand the request to the SDK."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self.manager is None:
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
        # The SDK binds a session to the credential that opened it: another key's request
        # for the session answers as if it did not exist.
        identity = principal.key_prefix or f"tenant:{principal.tenant}"
        scope["user"] = AuthenticatedUser(
            AccessToken(token=identity, client_id=identity, scopes=[], subject=principal.tenant)
        )
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await self.manager.handle_request(scope, receive, send)


def _credentials(scope: Scope) -> HTTPAuthorizationCredentials | None:
    """The Bearer credentials of the request, if it sent any."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)
    return None


def _sandbox_files(app: Any) -> SandboxFiles:
    """File access to sandboxes through the app's engine (made on first use, as for the
    REST file routes)."""
    return SandboxFiles(app.state.sandbox_engine())


def install_mcp(
    app: FastAPI,
    providers: Callable[[Services], list[ToolProvider]] | None = None,
) -> None:
    """Serve MCP at ``/mcp`` (outside the OpenAPI document): its session manager starts
    after the app's services and stops before them. ``providers`` makes the tool providers
    from the services (``default_providers`` if None, sandbox files through the app's
    ``sandbox_engine``)."""
    endpoint = McpEndpoint()
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint, include_in_schema=False))
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with inner(app_) as state:
            services: Services = app_.state.services
            if providers is None:
                made = default_providers(services, functools.partial(_sandbox_files, app_))
            else:
                made = providers(services)
            server = build_server(services, made)
            endpoint.manager = StreamableHTTPSessionManager(app=server)
            async with endpoint.manager.run():
                try:
                    yield state
                finally:
                    endpoint.manager = None

    app.router.lifespan_context = lifespan
