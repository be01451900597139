"""Sandboxes: create, read, list, delete; their commands (exec) and the commands' output."""

from __future__ import annotations

import tempfile
import uuid
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request, Response, WebSocket
from fastapi.concurrency import iterate_in_threadpool, run_in_threadpool
from fastapi.responses import StreamingResponse

from api.actions import sandboxes as actions
from api.actions.events import EventStreamResponse, refuse_past_stream_cap
from api.actions.sandbox_terminal import serve_terminal, terminal_engine
from api.deps import PrincipalDep, ServicesDep
from api.openapi import BINARY, BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from api.routes import IdempotencyKey, WaitSeconds
from api.sandbox_schemas import (
    ExecCreate,
    ExecOut,
    FileOut,
    SandboxCreate,
    SandboxOut,
    SandboxPage,
)
from runyard.runner import RunnerUnavailable
from runyard.sandboxes.files import SandboxFiles

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"], responses=COMMON_ERRORS)

SANDBOX_NOT_FOUND = problem("No such sandbox, or it belongs to another tenant")
EXEC_NOT_FOUND = problem("No such sandbox or command, or it belongs to another tenant")
MAX_PAGE = 200
# An upload is kept in memory up to this size, then in a temporary file, until it is sent.
SPOOL_IN_MEMORY = 1_048_576


@router.post(
    "",
    operation_id="createSandbox",
    status_code=201,
    response_model=SandboxOut,
    responses={
        409: problem(
            "Sandboxes need queue mode, or the Idempotency-Key was used with a different request"
        ),
        422: problem("Unknown tool, a tool without sandbox = true, or a limit above maximum"),
        429: problem("A tenant cap is full (a sandbox counts as a running run)", retry_after=True),
        503: problem("The queue is full, or the database is unavailable", retry_after=True),
        **BODY_ERRORS,
    },
)
async def post_sandbox(
    body: SandboxCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> SandboxOut:
    """Start a sandbox of a tool: a hardened, labelled container kept until its TTL, its idle
    timeout, a delete, or its own end. A retry with the same ``Idempotency-Key`` answers the
    first sandbox."""
    created = await run_in_threadpool(
        actions.create_sandbox, services, principal, body, idempotency_key
    )
    response.headers["Location"] = f"/v1/sandboxes/{created.id}"
    return created


@router.get("", operation_id="listSandboxes", response_model=SandboxPage)
async def list_sandboxes(
    services: ServicesDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> SandboxPage:
    """The caller's newest sandboxes, ended ones included."""
    found = await run_in_threadpool(actions.list_sandboxes, services, principal, limit)
    return SandboxPage(sandboxes=found)


@router.get(
    "/{sandbox_id}",
    operation_id="getSandbox",
    response_model=SandboxOut,
    responses={404: SANDBOX_NOT_FOUND},
)
async def get_sandbox(
    sandbox_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> SandboxOut:
    """One sandbox: its status, and why it ended if it did."""
    row = await run_in_threadpool(actions.load_sandbox, services, principal, sandbox_id)
    return actions.sandbox_out(row)


@router.delete(
    "/{sandbox_id}",
    operation_id="deleteSandbox",
    response_model=SandboxOut,
    responses={404: SANDBOX_NOT_FOUND},
)
async def delete_sandbox(
    sandbox_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> SandboxOut:
    """Stop the sandbox; its record stays (ended, ``end_reason`` ``deleted``)."""
    return await run_in_threadpool(actions.delete_sandbox, services, principal, sandbox_id)


@router.post(
    "/{sandbox_id}/exec",
    operation_id="createSandboxExec",
    status_code=202,
    response_model=ExecOut,
    responses={
        404: SANDBOX_NOT_FOUND,
        409: problem("The sandbox has ended"),
        **BODY_ERRORS,
    },
)
async def post_exec(
    sandbox_id: uuid.UUID,
    body: ExecCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    response: Response,
) -> ExecOut:
    """Run a command in the sandbox; it starts as soon as its owner picks it up."""
    created = await run_in_threadpool(actions.create_exec, services, principal, sandbox_id, body)
    response.headers["Location"] = f"/v1/sandboxes/{sandbox_id}/execs/{created.id}"
    return created


@router.get(
    "/{sandbox_id}/execs/{exec_id}",
    operation_id="getSandboxExec",
    response_model=ExecOut,
    responses={404: EXEC_NOT_FOUND},
)
async def get_exec(
    sandbox_id: uuid.UUID,
    exec_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    wait: WaitSeconds = 0,
) -> ExecOut:
    """The command with its output so far; ``?wait=`` holds the answer until it finished."""
    return await actions.await_exec(services, principal, sandbox_id, exec_id, wait)


@router.get(
    "/{sandbox_id}/execs/{exec_id}/events",
    operation_id="getSandboxExecEvents",
    response_class=EventStreamResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "``stdout`` and ``stderr`` events ({text}), then ``exit`` "
            "({exit_code, timed_out, error, truncated}); ids resume with Last-Event-ID",
        },
        404: EXEC_NOT_FOUND,
        503: problem("Too many open event streams", retry_after=True),
    },
)
async def exec_events(
    sandbox_id: uuid.UUID,
    exec_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
) -> EventStreamResponse:
    """The command's output as server-sent events, live and resumable."""
    ends = actions.start_ends(last_event_id)
    await run_in_threadpool(actions.load_exec, services, principal, sandbox_id, exec_id)
    refuse_past_stream_cap(services)
    return EventStreamResponse(actions.exec_events(services, principal, sandbox_id, exec_id, ends))


def _files(request: Request) -> SandboxFiles:
    """File access through this app's engine (``app.state.sandbox_engine``, made on first
    use)."""
    try:
        return SandboxFiles(request.app.state.sandbox_engine())
    except RunnerUnavailable as exc:
        raise Problem(503, "engine_unavailable", f"the container engine: {exc}") from exc


@router.put(
    "/{sandbox_id}/files/{path:path}",
    operation_id="uploadSandboxFile",
    response_model=FileOut,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": BINARY, "example": "hello\n"}},
        }
    },
    responses={
        404: SANDBOX_NOT_FOUND,
        409: problem("The sandbox is not running, or runs on an engine this API does not reach"),
        413: problem("The file is larger than the sandbox's disk limit"),
        422: problem("The path is absolute, has '..', or passes through a link"),
    },
)
async def put_file(
    sandbox_id: uuid.UUID,
    path: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
) -> FileOut:
    """Write the request body to ``path`` of the sandbox's workspace (parents made)."""
    row = await run_in_threadpool(actions.load_sandbox, services, principal, sandbox_id)
    files = _files(request)
    cap = actions.upload_cap(row)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as body:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise Problem(413, "file_too_large", f"the file is larger than {cap} bytes")
            await run_in_threadpool(body.write, chunk)
        await run_in_threadpool(body.seek, 0)
        stored = await run_in_threadpool(
            actions.put_file, services, principal, files, sandbox_id, path, body, size
        )
    return FileOut.model_validate(stored)


@router.get(
    "/{sandbox_id}/files/{path:path}",
    operation_id="downloadSandboxFile",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/octet-stream": {"schema": BINARY}, "application/x-tar": {}},
            "description": "The file's bytes, or a directory as a tar",
        },
        404: problem("No such sandbox or file"),
        409: problem("The sandbox is not running, or runs on an engine this API does not reach"),
        422: problem("The path is absolute, has '..', or passes through a link"),
    },
)
async def get_file(
    sandbox_id: uuid.UUID,
    path: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
) -> StreamingResponse:
    """A file of the sandbox's workspace, streamed; a directory (or ``/``) comes as a tar."""
    await run_in_threadpool(actions.load_sandbox, services, principal, sandbox_id)
    files = _files(request)
    found = await run_in_threadpool(actions.get_file, services, principal, files, sandbox_id, path)
    media = "application/x-tar" if found.is_dir else "application/octet-stream"
    name = f"{found.name}.tar" if found.is_dir else found.name
    return StreamingResponse(
        iterate_in_threadpool(found.chunks),
        media_type=media,
        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}"},
    )


@router.websocket("/{sandbox_id}/terminal")
async def terminal(
    websocket: WebSocket,
    sandbox_id: uuid.UUID,
    command: Annotated[list[str] | None, Query(max_length=256)] = None,
    rows: Annotated[int, Query(ge=1, le=1000)] = 24,
    cols: Annotated[int, Query(ge=1, le=1000)] = 80,
) -> None:
    """An interactive command (``?command=`` repeated; ``/bin/sh`` by default) with a TTY
    (``api.actions.sandbox_terminal`` says the frames)."""
    engine = await terminal_engine(websocket)
    if engine is None:
        return
    await serve_terminal(
        websocket,
        websocket.app.state.services,
        engine,
        sandbox_id,
        command or ["/bin/sh"],
        (rows, cols),
    )
