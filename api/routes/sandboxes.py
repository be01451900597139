"""Sandboxes: create, read, list, delete; their commands (exec) and the commands' output."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.concurrency import run_in_threadpool

from api.actions import sandboxes as actions
from api.actions.events import EventStreamResponse, refuse_past_stream_cap
from api.deps import PrincipalDep, ServicesDep
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.routes import WaitSeconds
from api.sandbox_schemas import ExecCreate, ExecOut, SandboxCreate, SandboxOut, SandboxPage

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"], responses=COMMON_ERRORS)

SANDBOX_NOT_FOUND = problem("No such sandbox, or it belongs to another tenant")
EXEC_NOT_FOUND = problem("No such sandbox or command, or it belongs to another tenant")
MAX_PAGE = 200


@router.post(
    "",
    operation_id="createSandbox",
    status_code=201,
    response_model=SandboxOut,
    responses={
        409: problem("Sandboxes need queue mode"),
        422: problem("Unknown tool, a tool without sandbox = true, or a limit above maximum"),
        429: problem("A tenant cap is full (a sandbox counts as a running run)", retry_after=True),
        503: problem("The queue is full, or the database is unavailable", retry_after=True),
        **BODY_ERRORS,
    },
)
async def post_sandbox(
    body: SandboxCreate, services: ServicesDep, principal: PrincipalDep, response: Response
) -> SandboxOut:
    """Start a sandbox of a tool: a hardened, labelled container kept until its TTL, its idle
    timeout, a delete, or its own end."""
    created = await run_in_threadpool(actions.create_sandbox, services, principal, body)
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
