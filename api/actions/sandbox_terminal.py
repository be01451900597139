"""A sandbox's terminal over a WebSocket: an interactive command with a TTY.

The client authenticates with ``Authorization: Bearer <key>`` on the upgrade request. Binary
frames it sends are typed into the TTY; text frames are JSON: ``{"type": "stdin", "data":
"..."}``, ``{"type": "resize", "rows": R, "cols": C}``, ``{"type": "signal", "name":
"INT"}`` (INT, TERM, KILL, HUP, QUIT). The server sends the TTY's output as binary frames
and, when the command ends, ``{"type": "exit", "exit_code": N}`` before it closes. A refusal
accepts, then closes at once with 4401 (key or session), 4403 (another site's page), 4404
(no such sandbox, or another tenant's), 4409 (not running, or on an engine this API does not
reach) or 4422 (a bad command), with the reason: a close before the handshake would reach a
client as a bare HTTP 403. The dashboard's terminal (``api.ui.sandbox_views``) runs the same
pump, authenticated by its session cookie and its page's origin instead of a key.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from fastapi import WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool

from api.actions.sandboxes import running_here, store_of
from api.deps import Services, principal_of_key
from api.problems import Problem
from runyard.domain.sandboxes import WORKSPACE, command_problem
from runyard.runner import RunnerUnavailable
from runyard.sandbox_engine import (
    TERMINAL_SIGNALS,
    SandboxFileEngine,
    SandboxNotRunning,
    SandboxTerminals,
    Terminal,
)
from runyard.sandboxes.files import SandboxFiles
from runyard.tenancy.auth import Principal

# The longest a text frame may be, and how often typing counts as use for the idle timeout.
MAX_TEXT_FRAME = 65_536
TOUCH_EVERY_SECONDS = 10.0
EXIT_WAIT_SECONDS = 2.0
CLOSE_CODES = {401: 4401, 403: 4403, 404: 4404, 422: 4422}

# Who is asking, or a Problem (401, 403) that closes the socket with its reason.
Authenticate = Callable[[], Awaitable[Principal]]


class TerminalEngine(SandboxFileEngine, SandboxTerminals, Protocol):
    """An engine that answers for a sandbox's files and opens its terminals."""


async def terminal_engine(websocket: WebSocket) -> TerminalEngine | None:
    """The app's sandbox engine; None once the socket is closed because none is reachable."""
    try:
        engine: TerminalEngine = websocket.app.state.sandbox_engine()
    except RunnerUnavailable as exc:
        await websocket.accept()
        await websocket.close(code=4409, reason=str(exc)[:120])
        return None
    return engine


async def serve_terminal(
    websocket: WebSocket,
    services: Services,
    engine: TerminalEngine,
    sandbox_id: uuid.UUID,
    command: list[str],
    size: tuple[int, int],
) -> None:
    """Authenticate by the Bearer key, open the terminal, and pump both ways until either side
    ends."""
    key = websocket.headers.get("authorization", "").removeprefix("Bearer ").strip()
    await serve_terminal_as(
        websocket,
        services,
        engine,
        lambda: principal_of_key(services, key),
        sandbox_id,
        command,
        size,
    )


async def serve_terminal_as(
    websocket: WebSocket,
    services: Services,
    engine: TerminalEngine,
    authenticate: Authenticate,
    sandbox_id: uuid.UUID,
    command: list[str],
    size: tuple[int, int],
) -> None:
    """Accept, ask ``authenticate`` who it is, open the terminal, and pump both ways."""
    await websocket.accept()
    try:
        principal = await authenticate()
        problem = command_problem(command)
        if problem is not None:
            raise Problem(422, "invalid_command", problem)
        row = await run_in_threadpool(
            running_here, services, principal, sandbox_id, SandboxFiles(engine)
        )
    except Problem as exc:
        await websocket.close(code=CLOSE_CODES.get(exc.status, 4409), reason=exc.detail[:120])
        return
    try:
        terminal = await run_in_threadpool(
            lambda: engine.open_terminal(
                row.container, command, cwd=WORKSPACE, rows=size[0], cols=size[1]
            )
        )
    except (SandboxNotRunning, RunnerUnavailable) as exc:
        await websocket.close(code=4409, reason=str(exc)[:120])
        return
    store = store_of(services)
    await run_in_threadpool(store.touch, sandbox_id)
    services.open_streams += 1
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_output, websocket, terminal, group.cancel_scope)
            await _input(websocket, terminal, lambda: store.touch(sandbox_id))
            group.cancel_scope.cancel()
    finally:
        services.open_streams -= 1
        await run_in_threadpool(terminal.close)


async def _output(websocket: WebSocket, terminal: Terminal, scope: anyio.CancelScope) -> None:
    """The TTY's output to the client, then the exit code, then the close."""
    while data := await anyio.to_thread.run_sync(terminal.receive, abandon_on_cancel=True):
        await websocket.send_bytes(data)
    give_up = time.monotonic() + EXIT_WAIT_SECONDS
    code = await run_in_threadpool(terminal.exit_code)
    while code is None and time.monotonic() < give_up:
        await anyio.sleep(0.05)
        code = await run_in_threadpool(terminal.exit_code)
    await websocket.send_text(json.dumps({"type": "exit", "exit_code": code}))
    await websocket.close()
    scope.cancel()


async def _input(websocket: WebSocket, terminal: Terminal, touch: Any) -> None:
    """The client's frames to the TTY until it hangs up."""
    touched = time.monotonic()
    while True:
        try:
            message = await websocket.receive()
        except (WebSocketDisconnect, RuntimeError):
            return
        if message["type"] == "websocket.disconnect":
            return
        if message.get("bytes") is not None:
            await run_in_threadpool(terminal.send, message["bytes"])
        elif message.get("text") is not None:
            await _command(websocket, terminal, message["text"])
        if time.monotonic() - touched >= TOUCH_EVERY_SECONDS:
            touched = time.monotonic()
            await run_in_threadpool(touch)


async def _command(websocket: WebSocket, terminal: Terminal, text: str) -> None:
    """One JSON control frame; a bad one is answered with an error frame, never a close."""
    try:
        if len(text) > MAX_TEXT_FRAME:
            raise ValueError(f"a text frame is at most {MAX_TEXT_FRAME} characters")
        frame = json.loads(text)
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "stdin":
            await run_in_threadpool(terminal.send, str(frame["data"]).encode())
        elif kind == "resize":
            rows, cols = int(frame["rows"]), int(frame["cols"])
            if not (1 <= rows <= 1000 and 1 <= cols <= 1000):
                raise ValueError("rows and cols must be 1 to 1000")
            await run_in_threadpool(terminal.resize, rows, cols)
        elif kind == "signal":
            name = str(frame["name"])
            if name not in TERMINAL_SIGNALS:
                raise ValueError(f"signal must be one of {sorted(TERMINAL_SIGNALS)}")
            await run_in_threadpool(terminal.signal, name)
        else:
            raise ValueError("type must be stdin, resize or signal")
    except (ValueError, KeyError, TypeError, RunnerUnavailable) as exc:
        await websocket.send_text(json.dumps({"type": "error", "detail": str(exc)[:300]}))
