"""The MCP server's handlers: tools from the providers, runs and their artifacts as
resources. Who calls is the principal the endpoint authenticated (``caller_of``)."""

from __future__ import annotations

import base64
import json
import mimetypes
from typing import Any

import anyio
import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

import runyard
from api.deps import Services, visible_tenant
from api.mcp.answers import (
    ARTIFACT_URI_TEMPLATE,
    RUN_URI_TEMPLATE,
    artifact_uri,
    parse_uri,
    run_document,
    run_uri,
)
from api.mcp.idempotency import BadIdempotencyKey, call_idempotency_key
from api.mcp.providers import ToolCall, ToolProvider
from api.mcp.runs import Progress
from runyard.artifacts.reads import Found
from runyard.reads.cursors import BadCursor
from runyard.reads.run_view import RunView
from runyard.reads.runs import RunFilter, RunReader
from runyard.tenancy.auth import Principal

# The ASGI scope entry where the endpoint leaves the authenticated caller.
PRINCIPAL_SCOPE_KEY = "runyard.principal"
SESSION_HEADER = "mcp-session-id"
# An artifact read through MCP comes whole in one message: larger ones are downloaded over
# HTTP instead (the error says where).
MAX_ARTIFACT_READ_BYTES = 4 * 1_048_576
RESOURCE_NOT_FOUND = -32002
# resources/list: the caller's runs, newest first, this many a page.
RESOURCE_PAGE = 50
MAX_CURSOR_LENGTH = 200

INSTRUCTIONS = """\
Every tool here runs in a hardened container as a durable run. A call answers when its run
ends, or after the server's longest wait with the run's id: fetch it then with the
runyard_get_run tool or the resource runyard://runs/{run_id}. To retry a call safely after a
dropped connection, send the same key in _meta as "io.runyard/idempotency_key". The
runyard_sandbox_* tools, where listed, hold a sandbox instead: a container you run commands
in and read and write files of, until you close it."""


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Principal:
    """The principal of the HTTP request that carried this message."""
    request = ctx.request
    principal = None if request is None else request.scope.get(PRINCIPAL_SCOPE_KEY)
    if not isinstance(principal, Principal):
        raise MCPError(types.INVALID_PARAMS, "unauthenticated: send an API key as a Bearer token")
    return principal


def _session_id(ctx: ServerRequestContext[Any, Any]) -> str | None:
    request = ctx.request
    return None if request is None else request.headers.get(SESSION_HEADER)


def _progress_of(ctx: ServerRequestContext[Any, Any]) -> Progress | None:
    """Progress to the caller, if its request carried a progress token."""
    if ctx.meta is None or ctx.meta.get("progress_token") is None:
        return None
    return ctx.session.report_progress


def build_server(services: Services, providers: list[ToolProvider]) -> Server[Any]:
    """The MCP server over ``providers``, for the API's ``services``."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal = caller_of(ctx)
        seen: dict[str, types.Tool] = {}
        for provider in providers:
            for tool in provider.tools(principal):
                seen.setdefault(tool.name, tool)
        return types.ListToolsResult(tools=list(seen.values()))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        principal = caller_of(ctx)
        meta: dict[str, Any] = dict(ctx.meta or {})
        try:
            key = call_idempotency_key(meta, _session_id(ctx), ctx.request_id)
        except BadIdempotencyKey as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
        call = ToolCall(principal, params.name, params.arguments or {}, key, _progress_of(ctx))
        for provider in providers:
            answer = await provider.call(call)
            if answer is not None:
                return answer
        raise MCPError(
            types.INVALID_PARAMS,
            f"unknown tool {params.name[:100]!r}: tools/list shows the tools this key may call",
        )

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        principal = caller_of(ctx)
        cursor = None if params is None else params.cursor
        if cursor is not None and len(cursor) > MAX_CURSOR_LENGTH:
            raise MCPError(types.INVALID_PARAMS, "cursor: not a cursor this server gave")
        try:
            views, next_cursor = await anyio.to_thread.run_sync(
                _recent_runs, services, principal, cursor
            )
        except BadCursor as exc:
            raise MCPError(types.INVALID_PARAMS, f"cursor: {exc}") from exc
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=run_uri(view.id),
                    name=f"{view.tool} {view.status.value}",
                    description=f"run {view.id} of {view.tool}, requested "
                    f"{view.requested_at.isoformat()}",
                    mime_type="application/json",
                )
                for view in views
            ],
            next_cursor=next_cursor,
        )

    async def list_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        caller_of(ctx)
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name="run",
                    uri_template=RUN_URI_TEMPLATE,
                    description="A run as GET /v1/runs/{id} shows it",
                    mime_type="application/json",
                ),
                types.ResourceTemplate(
                    name="artifact",
                    uri_template=ARTIFACT_URI_TEMPLATE,
                    description="A file a finished run left under /runyard/out",
                ),
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        principal = caller_of(ctx)
        where = parse_uri(str(params.uri))
        if where is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"no resource {str(params.uri)[:200]!r}")
        run_id, path = where
        if path is None:
            reader = RunReader(services.engine)
            view = await anyio.to_thread.run_sync(reader.view, run_id, visible_tenant(principal))
            if view is None:
                raise MCPError(RESOURCE_NOT_FOUND, f"no run {run_id}")
            return types.ReadResourceResult(
                contents=[
                    types.TextResourceContents(
                        uri=run_uri(run_id),
                        mime_type="application/json",
                        text=json.dumps(run_document(view)),
                    )
                ]
            )
        return await anyio.to_thread.run_sync(_read_artifact, services, principal, run_id, path)

    return Server(
        "runyard",
        version=runyard.__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


def _recent_runs(
    services: Services, principal: Principal, cursor: str | None
) -> tuple[list[RunView], str | None]:
    """A page of the runs the caller may see, newest first, and the next page's cursor."""
    reader = RunReader(services.engine)
    filters = RunFilter(tenant=visible_tenant(principal))
    rows, next_cursor = reader.page(filters, limit=RESOURCE_PAGE, cursor=cursor)
    return reader.views(rows), next_cursor


def _read_artifact(
    services: Services, principal: Principal, run_id: Any, path: str
) -> types.ReadResourceResult:
    """One artifact's bytes, if the caller may see the finished run and it is small enough."""
    published = services.artifacts.published(run_id, visible_tenant(principal))
    if published.found is Found.NOT_FOUND:
        raise MCPError(RESOURCE_NOT_FOUND, f"no run {run_id}")
    if published.found is Found.NOT_FINISHED:
        raise MCPError(RESOURCE_NOT_FOUND, f"run {run_id} is {published.status}: no artifacts yet")
    file = services.artifacts.file(published, path)
    if file is None:
        raise MCPError(RESOURCE_NOT_FOUND, f"run {run_id} has no artifact {path[:200]!r}")
    if file.size > MAX_ARTIFACT_READ_BYTES:
        raise MCPError(
            types.INVALID_PARAMS,
            f"artifact_too_large: {path} has {file.size} bytes, more than an MCP read carries "
            f"({MAX_ARTIFACT_READ_BYTES}); download it from /v1/runs/{run_id}/artifacts/{path}",
        )
    data = b"".join(services.artifacts.read(published, path, 0, file.size))
    return types.ReadResourceResult(
        contents=[
            types.BlobResourceContents(
                uri=artifact_uri(run_id, path),
                mime_type=mimetypes.guess_type(path)[0] or "application/octet-stream",
                blob=base64.b64encode(data).decode("ascii"),
            )
        ]
    )
