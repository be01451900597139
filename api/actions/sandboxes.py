"""Sandboxes for a caller: create, read, list, delete, and their commands with output."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import IO

import anyio
from fastapi.concurrency import run_in_threadpool

from api.actions.runs import submit_problem
from api.deps import Services, visible_tenant
from api.problems import Problem
from api.sandbox_schemas import ExecCreate, ExecOut, SandboxCreate, SandboxOut
from runyard.domain.sandboxes import (
    MAX_EXECS_TOTAL,
    command_problem,
    env_problem,
    event_id,
    parse_event_id,
    reason_of,
    workspace_dir,
)
from runyard.reads.notify import Subscription
from runyard.runner import RunnerUnavailable
from runyard.sandbox_engine import SandboxNotRunning
from runyard.sandboxes.create import NotASandboxTool, Sandboxes, SandboxRequest
from runyard.sandboxes.files import Download, FileRefused, SandboxFiles
from runyard.sandboxes.store import Chunk, ExecRow, NewExec, SandboxRow, SandboxStore
from runyard.tenancy.auth import Principal

CHUNK_PAGE = 64
# Readers wake on the sandbox's notifications (a chunk stored, a command finished) and look
# again at least this often without one.
EXEC_POLL_SECONDS = 0.1
EXEC_POLL_MAX_SECONDS = 1.0
ENDED_ERROR = "the sandbox ended before the command did"


def store_of(services: Services) -> SandboxStore:
    """The sandbox statements over the API's engine."""
    return SandboxStore(services.engine)


def sandbox_out(row: SandboxRow) -> SandboxOut:
    """The public shape of a stored sandbox."""
    status = "ended" if row.status.is_terminal else "starting"
    if row.status.value == "running" and row.ready_at is not None:
        status = "running"
    return SandboxOut(
        id=row.run_id,
        tool=row.tool,
        status=status,
        end_reason=reason_of(row.status, row.error_code),
        error=row.error,
        created_at=row.created_at,
        started_at=row.started_at,
        ended_at=row.finished_at,
        expires_at=row.deadline_at,
        idle_timeout_seconds=row.idle_timeout_seconds,
        last_active_at=row.last_active_at,
        max_execs=row.max_execs,
    )


def load_sandbox(services: Services, principal: Principal, sandbox_id: uuid.UUID) -> SandboxRow:
    """The sandbox if the caller may see it; 404 otherwise (another tenant's included)."""
    row = store_of(services).view(sandbox_id, visible_tenant(principal))
    if row is None:
        raise Problem(404, "sandbox_not_found", f"no sandbox {sandbox_id}")
    return row


def create_sandbox(
    services: Services,
    principal: Principal,
    body: SandboxCreate,
    idempotency_key: str | None = None,
) -> SandboxOut:
    """Submit the sandbox's run; 409 in sync mode or for a key used with another request,
    422 for a tool that allows none, 429 past the tenant's quotas (a sandbox counts as a
    running run)."""
    if services.sync is not None:
        raise Problem(
            409,
            "queue_mode_only",
            "sandboxes need queue mode; this API runs tools inline (sync mode)",
        )
    limits = body.limits.model_dump(exclude_none=True) if body.limits else {}
    ttl = body.ttl_seconds or limits.pop("timeout_seconds", None)
    request = SandboxRequest(
        tenant=principal.tenant,
        tool=body.tool,
        ttl_seconds=ttl,
        idle_timeout_seconds=body.idle_timeout_seconds,
        max_execs=body.max_execs,
        limits=limits,
        env=body.env,
        allowed_tools=principal.tools,
        idempotency_key=idempotency_key,
    )
    uses = Sandboxes(
        services.queue,
        services.registry,
        services.caps,
        store_of(services),
        output_cap=services.settings.stdout_cap_bytes,
    )
    try:
        run_id = uses.create(request)
    except NotASandboxTool as exc:
        raise Problem(422, "not_a_sandbox_tool", str(exc), field="tool") from exc
    except Exception as exc:
        problem = submit_problem(services, exc)
        if problem is None:
            raise
        raise problem from exc
    return sandbox_out(load_sandbox(services, principal, run_id))


def list_sandboxes(services: Services, principal: Principal, limit: int) -> list[SandboxOut]:
    """The caller's tenant's newest sandboxes."""
    return [sandbox_out(row) for row in store_of(services).page(principal.tenant, limit)]


def delete_sandbox(services: Services, principal: Principal, sandbox_id: uuid.UUID) -> SandboxOut:
    """Stop the sandbox (its owner stops the container at its next renewal); its record
    stays. Deleting an ended sandbox changes nothing."""
    row = load_sandbox(services, principal, sandbox_id)
    if not row.status.is_terminal:
        services.queue.cancel(sandbox_id)
    return sandbox_out(load_sandbox(services, principal, sandbox_id))


def create_exec(
    services: Services, principal: Principal, sandbox_id: uuid.UUID, body: ExecCreate
) -> ExecOut:
    """Queue a command for the sandbox's owner; 409 once the sandbox has ended."""
    load_sandbox(services, principal, sandbox_id)
    problem = command_problem(body.command)
    if problem is not None:
        raise Problem(422, "invalid_command", problem, field="command")
    problem = env_problem(body.env)
    if problem is not None:
        raise Problem(422, "invalid_env", problem, field="env")
    cwd = workspace_dir(body.cwd)
    if cwd is None:
        raise Problem(422, "invalid_cwd", "cwd must stay inside the workspace", field="cwd")
    stdin = body.stdin_bytes()
    if stdin is None:
        raise Problem(422, "invalid_stdin", "stdin_base64 is not base64", field="stdin_base64")
    if len(stdin) > services.settings.max_request_bytes:
        raise Problem(422, "invalid_stdin", "stdin is too large", field="stdin")
    new = NewExec(body.command, stdin, body.env, cwd, body.timeout_seconds)
    exec_id = store_of(services).insert_exec(sandbox_id, new)
    if exec_id is None:
        row = load_sandbox(services, principal, sandbox_id)
        if not row.status.is_terminal:
            raise Problem(
                429,
                "too_many_execs",
                f"sandbox {sandbox_id} has had its {MAX_EXECS_TOTAL} commands; make a new one",
            )
        raise Problem(409, "sandbox_ended", f"sandbox {sandbox_id} has ended")
    return read_exec(services, principal, sandbox_id, exec_id)


def load_exec(
    services: Services, principal: Principal, sandbox_id: uuid.UUID, exec_id: uuid.UUID
) -> ExecRow:
    """The command if the caller may see its sandbox; 404 otherwise."""
    row = store_of(services).exec_view(sandbox_id, exec_id, visible_tenant(principal))
    if row is None:
        raise Problem(404, "exec_not_found", f"no exec {exec_id} in sandbox {sandbox_id}")
    return row


def _status_of(row: ExecRow) -> tuple[str, str | None]:
    """A command its ended sandbox left unfinished counts as finished, with that error."""
    if row.status != "finished" and row.sandbox_status.is_terminal:
        return "finished", ENDED_ERROR
    return row.status, row.error


def _read_chunks(
    store: SandboxStore, exec_id: uuid.UUID, out: dict[str, bytearray], ends: dict[str, int]
) -> None:
    """Append the command's output stored past ``ends`` to ``out``, moving ``ends``."""
    while True:
        chunks = store.chunks_from(exec_id, ends["stdout"], ends["stderr"], CHUNK_PAGE)
        for chunk in chunks:
            out[chunk.stream] += chunk.data
            ends[chunk.stream] = chunk.offset + chunk.length
        if len(chunks) < CHUNK_PAGE:
            return


def read_exec(
    services: Services, principal: Principal, sandbox_id: uuid.UUID, exec_id: uuid.UUID
) -> ExecOut:
    """A command with all its stored output."""
    store = store_of(services)
    row = load_exec(services, principal, sandbox_id, exec_id)
    out = {"stdout": bytearray(), "stderr": bytearray()}
    ends = {"stdout": 0, "stderr": 0}
    while True:
        _read_chunks(store, exec_id, out, ends)
        if row.status == "finished":
            break
        # The row vouches only for output read after it: one seen finished now has its last
        # chunk stored, so one more read completes ``out``.
        row = load_exec(services, principal, sandbox_id, exec_id)
        if row.status != "finished":
            break
    status, error = _status_of(row)
    return ExecOut(
        id=row.id,
        sandbox_id=row.run_id,
        command=list(row.command),
        cwd=row.cwd,
        status=status,
        exit_code=row.exit_code,
        timed_out=row.timed_out,
        error=error,
        stdout=out["stdout"].decode("utf-8", "replace"),
        stderr=out["stderr"].decode("utf-8", "replace"),
        truncated=row.truncated,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


async def await_exec(
    services: Services,
    principal: Principal,
    sandbox_id: uuid.UUID,
    exec_id: uuid.UUID,
    wait: float,
) -> ExecOut:
    """The command, once finished or after ``wait`` seconds (capped), whichever is first."""
    give_up = time.monotonic() + min(wait, services.settings.max_wait_seconds)
    pause = EXEC_POLL_SECONDS
    with services.notifier.subscribe(sandbox_id) as woken:
        while True:
            found = await run_in_threadpool(read_exec, services, principal, sandbox_id, exec_id)
            if found.status == "finished" or time.monotonic() >= give_up:
                return found
            await woken.wait(min(pause, max(0.0, give_up - time.monotonic())))
            pause = min(pause * 2, EXEC_POLL_MAX_SECONDS)


def _sse(chunk: Chunk, ends: dict[str, int]) -> str:
    ends[chunk.stream] = chunk.offset + chunk.length
    data = json.dumps({"text": chunk.data.decode("utf-8", "replace")})
    return (
        f"id: {event_id(ends['stdout'], ends['stderr'])}\nevent: {chunk.stream}\ndata: {data}\n\n"
    )


def start_ends(last_event_id: str | None) -> dict[str, int]:
    """Where a stream resumes: both streams' ends named by ``Last-Event-ID``; 422 if it is
    not an id of ours."""
    ends = parse_event_id(last_event_id)
    if ends is None:
        raise Problem(422, "validation_error", "Last-Event-ID is not an exec event id")
    return {"stdout": ends[0], "stderr": ends[1]}


async def exec_events(
    services: Services,
    principal: Principal,
    sandbox_id: uuid.UUID,
    exec_id: uuid.UUID,
    ends: dict[str, int],
) -> AsyncIterator[str]:
    """The command's output as SSE from ``ends`` on, then ``exit``; bounded in time like a
    run's events (the client resumes with ``Last-Event-ID``)."""
    services.open_streams += 1
    try:
        yield "retry: 2000\n\n"
        with services.notifier.subscribe(sandbox_id) as woken:
            async for message in _exec_messages(
                services, principal, (sandbox_id, exec_id), ends, woken
            ):
                yield message
    finally:
        services.open_streams -= 1


async def _exec_messages(
    services: Services,
    principal: Principal,
    ids: tuple[uuid.UUID, uuid.UUID],
    ends: dict[str, int],
    woken: Subscription,
) -> AsyncIterator[str]:
    """What ``exec_events`` sends: the chunks stored since ``ends``, woken by the sandbox's
    notifications (or a poll), then the exit once every stored byte was sent."""
    sandbox_id, exec_id = ids
    store = store_of(services)
    started = last_sent = time.monotonic()
    pause = EXEC_POLL_SECONDS
    while True:
        chunks = await anyio.to_thread.run_sync(
            store.chunks_from,
            exec_id,
            ends["stdout"],
            ends["stderr"],
            CHUNK_PAGE,
            limiter=services.events_limiter,
        )
        for chunk in chunks:
            yield _sse(chunk, ends)
            last_sent = time.monotonic()
        if time.monotonic() - last_sent >= services.settings.events_keepalive_seconds:
            yield ": keepalive\n\n"
            last_sent = time.monotonic()
        if len(chunks) == CHUNK_PAGE:
            continue
        row = await run_in_threadpool(load_exec, services, principal, sandbox_id, exec_id)
        status, error = _status_of(row)
        caught_up = (ends["stdout"], ends["stderr"]) == (row.stdout_end, row.stderr_end)
        if status == "finished" and (caught_up or row.status != "finished"):
            data = {
                "exit_code": row.exit_code,
                "timed_out": row.timed_out,
                "error": error,
                "truncated": row.truncated,
            }
            name = event_id(ends["stdout"], ends["stderr"])
            yield f"id: {name}\nevent: exit\ndata: {json.dumps(data)}\n\n"
            return
        if time.monotonic() - started >= services.settings.events_max_stream_seconds:
            return
        pause = EXEC_POLL_SECONDS if chunks else min(pause * 2, EXEC_POLL_MAX_SECONDS)
        await woken.wait(pause)


# --- files ---


def running_here(
    services: Services, principal: Principal, sandbox_id: uuid.UUID, files: SandboxFiles
) -> SandboxRow:
    """The sandbox, running on the engine this API reaches; 409 otherwise (a file's route
    and a terminal ask)."""
    row = load_sandbox(services, principal, sandbox_id)
    if row.status.value != "running" or row.ready_at is None:
        raise Problem(409, "sandbox_not_running", f"sandbox {sandbox_id} is not running")
    try:
        here = files.engine_id()
    except RunnerUnavailable as exc:
        raise Problem(503, "engine_unavailable", f"the container engine: {exc}") from exc
    if row.engine_id != here:
        raise Problem(
            409, "engine_elsewhere", "the sandbox runs on an engine this API does not reach"
        )
    return row


def _file_problem(exc: Exception) -> Problem:
    if isinstance(exc, FileRefused):
        return Problem(exc.status, exc.code, str(exc), field="path")
    if isinstance(exc, SandboxNotRunning):
        return Problem(409, "sandbox_not_running", str(exc))
    return Problem(503, "engine_unavailable", f"the container engine: {exc}")


def upload_cap(row: SandboxRow) -> int:
    """The most one upload may carry: the sandbox's disk limit."""
    return (row.disk_mb or 1024) * 1_048_576


def put_file(
    services: Services,
    principal: Principal,
    files: SandboxFiles,
    sandbox_id: uuid.UUID,
    path: str,
    body: IO[bytes],
    size: int,
) -> dict[str, object]:
    """Write an uploaded file into the sandbox's workspace."""
    row = running_here(services, principal, sandbox_id, files)
    store_of(services).touch(sandbox_id)
    try:
        stored_path = files.upload(row.container, path, body, size, row.container_user)
    except (FileRefused, SandboxNotRunning, RunnerUnavailable) as exc:
        raise _file_problem(exc) from exc
    return {"path": stored_path, "size": size}


def get_file(
    services: Services,
    principal: Principal,
    files: SandboxFiles,
    sandbox_id: uuid.UUID,
    path: str,
) -> Download:
    """A file of the sandbox's workspace (a directory as a tar), streamed."""
    row = running_here(services, principal, sandbox_id, files)
    store_of(services).touch(sandbox_id)
    try:
        return files.download(row.container, path)
    except (FileRefused, SandboxNotRunning, RunnerUnavailable) as exc:
        raise _file_problem(exc) from exc
