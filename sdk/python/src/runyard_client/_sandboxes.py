"""Sandboxes: the calls both clients send, the models they read, and the ``Sandbox`` (and
``AsyncSandbox``) handle ``create_sandbox`` returns, a context manager that deletes it."""

from __future__ import annotations

import asyncio
import base64
import builtins
import json
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import httpx2
from pydantic import Field

from runyard_client._calls import WAIT_SLICE_SECONDS, Call, Id, segment
from runyard_client._config import error_of
from runyard_client.models import Model

if TYPE_CHECKING:
    from runyard_client._async_client import AsyncRunyard
    from runyard_client._client import Runyard

# One SSE message of a command's output may carry a whole read (a MiB) as JSON text.
MAX_EXEC_EVENT_BYTES = 8 * 1_048_576


class SandboxInfo(Model):
    """A sandbox as the API shows it."""

    id: str
    tool: str
    status: Literal["starting", "running", "ended"]
    end_reason: str | None = None
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    expires_at: datetime | None = None
    idle_timeout_seconds: int
    last_active_at: datetime
    max_execs: int


class SandboxPage(Model):
    """The caller's newest sandboxes."""

    sandboxes: builtins.list[SandboxInfo]


class ExecResult(Model):
    """A command in a sandbox, with its output so far."""

    id: str
    sandbox_id: str
    command: builtins.list[str]
    cwd: str
    status: Literal["pending", "running", "finished"]
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class ExecEvent(Model):
    """A piece of a command's output (``stdout``, ``stderr``), or its ``exit``."""

    stream: Literal["stdout", "stderr", "exit"]
    text: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    truncated: bool = False
    id: str | None = Field(default=None, description="Resume after it with Last-Event-ID")


# --- the calls ---


def _sandbox(response: httpx2.Response) -> SandboxInfo:
    return SandboxInfo.model_validate_json(response.content)


def _exec(response: httpx2.Response) -> ExecResult:
    return ExecResult.model_validate_json(response.content)


def _bytes(response: httpx2.Response) -> bytes:
    return response.content


def _nothing(response: httpx2.Response) -> None:
    return None


def create_sandbox(
    tool: str,
    *,
    ttl_seconds: int | None = None,
    idle_timeout_seconds: int | None = None,
    max_execs: int | None = None,
    limits: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
) -> Call[SandboxInfo]:
    """``POST /v1/sandboxes`` with only the fields given; with a key, safe to retry."""
    body: dict[str, Any] = {"tool": tool}
    given = {
        "ttl_seconds": ttl_seconds,
        "idle_timeout_seconds": idle_timeout_seconds,
        "max_execs": max_execs,
        "limits": dict(limits) if limits else None,
        "env": dict(env) if env else None,
    }
    body.update({k: v for k, v in given.items() if v is not None})
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/sandboxes", _sandbox, json=body, headers=headers)


def get_sandbox(sandbox_id: Id) -> Call[SandboxInfo]:
    """``GET /v1/sandboxes/{id}``."""
    return Call("GET", f"/v1/sandboxes/{segment(sandbox_id)}", _sandbox)


def list_sandboxes(limit: int = 50) -> Call[SandboxPage]:
    """``GET /v1/sandboxes``."""
    return Call(
        "GET",
        "/v1/sandboxes",
        lambda r: SandboxPage.model_validate_json(r.content),
        params={"limit": limit},
    )


def delete_sandbox(sandbox_id: Id) -> Call[SandboxInfo]:
    """``DELETE /v1/sandboxes/{id}``."""
    return Call("DELETE", f"/v1/sandboxes/{segment(sandbox_id)}", _sandbox)


def create_exec(
    sandbox_id: Id,
    command: Sequence[str],
    *,
    stdin: str | bytes = "",
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_seconds: int | None = None,
) -> Call[ExecResult]:
    """``POST /v1/sandboxes/{id}/exec``."""
    body: dict[str, Any] = {"command": list(command)}
    if isinstance(stdin, bytes):
        body["stdin_base64"] = base64.b64encode(stdin).decode()
    elif stdin:
        body["stdin"] = stdin
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if timeout_seconds is not None:
        body["timeout_seconds"] = timeout_seconds
    return Call("POST", f"/v1/sandboxes/{segment(sandbox_id)}/exec", _exec, json=body)


def get_exec(sandbox_id: Id, exec_id: Id, wait: float = 0.0) -> Call[ExecResult]:
    """``GET /v1/sandboxes/{id}/execs/{exec_id}``, held up to ``wait`` seconds."""
    path = f"/v1/sandboxes/{segment(sandbox_id)}/execs/{segment(exec_id)}"
    if wait <= 0:
        return Call("GET", path, _exec)
    return Call("GET", path, _exec, params={"wait": wait}, held_seconds=wait)


def exec_events_path(sandbox_id: Id, exec_id: Id) -> str:
    """Where a command's output streams as SSE."""
    return f"/v1/sandboxes/{segment(sandbox_id)}/execs/{segment(exec_id)}/events"


def file_path(sandbox_id: Id, path: str) -> str:
    """The route of a file of the workspace (each segment quoted)."""
    parts = "/".join(segment(part) for part in path.strip("/").split("/") if part)
    return f"/v1/sandboxes/{segment(sandbox_id)}/files/{parts}"


def upload_file(sandbox_id: Id, path: str, data: bytes) -> Call[None]:
    """``PUT /v1/sandboxes/{id}/files/{path}`` with the file's bytes."""
    return Call(
        "PUT",
        file_path(sandbox_id, path),
        _nothing,
        content=data,
        headers={"Content-Type": "application/octet-stream"},
    )


def download_file(sandbox_id: Id, path: str) -> Call[bytes]:
    """``GET /v1/sandboxes/{id}/files/{path}``: a file's bytes, or a directory's tar."""
    return Call("GET", file_path(sandbox_id, path), _bytes, unbounded_read=True)


def exec_event(event: str, data: str, event_id: str | None) -> ExecEvent | None:
    """One SSE message of a command's stream as an event; None for one we do not know."""
    if event not in ("stdout", "stderr", "exit"):
        return None
    fields = json.loads(data)
    return ExecEvent.model_validate({**fields, "stream": event, "id": event_id or None})


class _Follow:
    """Following a command's events across reconnects: where it resumes, when it is done."""

    def __init__(self, sandbox_id: Id, exec_id: Id, last_event_id: str | None = None) -> None:
        self.path = exec_events_path(sandbox_id, exec_id)
        self.last_event_id = last_event_id
        self.done = False

    def options(self) -> dict[str, Any]:
        """The stream request's options: resume after the last event seen."""
        headers = {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}
        return {"headers": headers, "max_event_size": MAX_EXEC_EVENT_BYTES, "timeout": None}

    def take(self, name: str, data: str, event_id: str | None) -> ExecEvent | None:
        """One message as an event (None if unknown); ``exit`` ends the follow."""
        event = exec_event(name, data, event_id)
        if event is not None:
            self.last_event_id = event.id or self.last_event_id
            self.done = event.stream == "exit"
        return event


def _content(data: bytes | str | os.PathLike[str]) -> bytes:
    if isinstance(data, bytes):
        return data
    return Path(data).read_bytes()


# --- the handles ---


class Sandbox:
    """A sandbox of a ``Runyard`` client; ``with`` deletes it on the way out."""

    def __init__(self, client: Runyard, info: SandboxInfo) -> None:
        self._client = client
        self.info = info

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self.info.id

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def refresh(self) -> SandboxInfo:
        """Read the sandbox again."""
        self.info = self._client._send(get_sandbox(self.id))
        return self.info

    def wait_running(self, timeout: float = 120.0) -> SandboxInfo:
        """Wait until its container runs (or it ended)."""
        deadline = time.monotonic() + timeout
        while self.refresh().status == "starting" and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.info

    def exec(
        self,
        command: Sequence[str],
        *,
        stdin: str | bytes = "",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_seconds: int | None = None,
        wait: bool = True,
    ) -> ExecResult:
        """Run a command; with ``wait`` (the default) answer once it finished."""
        call = create_exec(
            self.id, command, stdin=stdin, env=env, cwd=cwd, timeout_seconds=timeout_seconds
        )
        started = self._client._send(call)
        if not wait:
            return started
        return self.wait_exec(started.id)

    def wait_exec(self, exec_id: Id) -> ExecResult:
        """A command once it finished (long-polls of ``WAIT_SLICE_SECONDS``)."""
        while True:
            found = self._client._send(get_exec(self.id, exec_id, WAIT_SLICE_SECONDS))
            if found.status == "finished":
                return found

    def exec_stream(
        self,
        command: Sequence[str],
        *,
        stdin: str | bytes = "",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_seconds: int | None = None,
    ) -> Iterator[ExecEvent]:
        """Run a command and yield its output as it comes, then its ``exit``."""
        call = create_exec(
            self.id, command, stdin=stdin, env=env, cwd=cwd, timeout_seconds=timeout_seconds
        )
        started = self._client._send(call)
        yield from self.events(started.id)

    def events(self, exec_id: Id, last_event_id: str | None = None) -> Iterator[ExecEvent]:
        """A command's output events from ``last_event_id`` on, reconnecting until ``exit``."""
        follow = _Follow(self.id, exec_id, last_event_id)
        while not follow.done:
            with self._client._http.sse(follow.path, **follow.options()) as source:
                if source.response.status_code >= 400:
                    source.response.read()
                    raise error_of(source.response)
                for message in source:
                    event = follow.take(message.event, message.data, message.id)
                    if event is not None:
                        yield event
                    if follow.done:
                        return

    def upload(self, path: str, data: bytes | str | os.PathLike[str]) -> None:
        """Write ``data`` (bytes, or a local file's path) to ``path`` of the workspace."""
        self._client._send(upload_file(self.id, path, _content(data)))

    def download(self, path: str) -> bytes:
        """A file of the workspace (a directory comes as a tar)."""
        return self._client._send(download_file(self.id, path))

    def close(self) -> None:
        """Delete the sandbox (its record stays); deleting an ended one is fine."""
        self.info = self._client._send(delete_sandbox(self.id))


class AsyncSandbox:
    """A sandbox of an ``AsyncRunyard`` client; ``async with`` deletes it on the way out."""

    def __init__(self, client: AsyncRunyard, info: SandboxInfo) -> None:
        self._client = client
        self.info = info

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self.info.id

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def refresh(self) -> SandboxInfo:
        """Read the sandbox again."""
        self.info = await self._client._send(get_sandbox(self.id))
        return self.info

    async def wait_running(self, timeout: float = 120.0) -> SandboxInfo:
        """Wait until its container runs (or it ended)."""
        deadline = time.monotonic() + timeout
        while (await self.refresh()).status == "starting" and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return self.info

    async def exec(
        self,
        command: Sequence[str],
        *,
        stdin: str | bytes = "",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_seconds: int | None = None,
        wait: bool = True,
    ) -> ExecResult:
        """Run a command; with ``wait`` (the default) answer once it finished."""
        call = create_exec(
            self.id, command, stdin=stdin, env=env, cwd=cwd, timeout_seconds=timeout_seconds
        )
        started = await self._client._send(call)
        if not wait:
            return started
        while True:
            found = await self._client._send(get_exec(self.id, started.id, WAIT_SLICE_SECONDS))
            if found.status == "finished":
                return found

    async def exec_stream(self, command: Sequence[str], **options: Any) -> AsyncIterator[ExecEvent]:
        """Run a command and yield its output as it comes, then its ``exit``."""
        started = await self._client._send(create_exec(self.id, command, **options))
        follow = _Follow(self.id, started.id)
        while not follow.done:
            async with self._client._http.sse(follow.path, **follow.options()) as source:
                if source.response.status_code >= 400:
                    await source.response.aread()
                    raise error_of(source.response)
                async for message in source:
                    event = follow.take(message.event, message.data, message.id)
                    if event is not None:
                        yield event
                    if follow.done:
                        return

    async def upload(self, path: str, data: bytes | str | os.PathLike[str]) -> None:
        """Write ``data`` (bytes, or a local file's path) to ``path`` of the workspace."""
        await self._client._send(upload_file(self.id, path, _content(data)))

    async def download(self, path: str) -> bytes:
        """A file of the workspace (a directory comes as a tar)."""
        return await self._client._send(download_file(self.id, path))

    async def close(self) -> None:
        """Delete the sandbox (its record stays)."""
        self.info = await self._client._send(delete_sandbox(self.id))
