"""The MCP SDK's side of ``/mcp``: the SDK's session manager over runyard's server, and the
hand-over of an authenticated request to it. ``api.mcp.mount`` imports this module on the
first request to ``/mcp`` only: the SDK's import is about a second of CPU."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from api.mcp.server import PRINCIPAL_SCOPE_KEY, build_server

if TYPE_CHECKING:
    from api.deps import Services
    from api.mcp.providers import ToolProvider
    from runyard.tenancy.auth import Principal


class McpSessions:
    """The SDK's sessions of one app's lifespan, over the server of ``providers``."""

    def __init__(self, services: Services, providers: list[ToolProvider]) -> None:
        self._manager = StreamableHTTPSessionManager(app=build_server(services, providers))

    def run(self) -> AbstractAsyncContextManager[None]:
        """The sessions' life: requests are served inside it; leaving it ends them all."""
        return self._manager.run()

    async def handle(self, scope: Scope, receive: Receive, send: Send, caller: Principal) -> None:
        """Serve one request of ``caller``, already authenticated."""
        # The SDK binds a session to the credential that opened it: another key's request
        # for the session answers as if it did not exist.
        identity = caller.key_prefix or f"tenant:{caller.tenant}"
        scope["user"] = AuthenticatedUser(
            AccessToken(token=identity, client_id=identity, scopes=[], subject=caller.tenant)
        )
        scope[PRINCIPAL_SCOPE_KEY] = caller
        await self._manager.handle_request(scope, receive, send)
