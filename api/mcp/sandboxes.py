"""Sandbox tools over MCP: create a sandbox, run commands in it, read and write its files,
close it. Every call goes through the sandbox actions the REST routes use
(``api.actions.sandboxes``); this module only turns arguments into their requests and their
answers into tool results."""

from __future__ import annotations

import functools
import io
import uuid
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp.types as types
from pydantic import BaseModel, ValidationError

from api.actions import sandboxes as actions
from api.deps import Services
from api.mcp.answers import problem_answer
from api.mcp.sandbox_answers import (
    CLOSE_TOOL,
    CREATE_TOOL,
    EXEC_TOOL,
    GET_EXEC_TOOL,
    MAX_FILE_BYTES,
    READ_FILE_TOOL,
    WRITE_FILE_TOOL,
    decoded_content,
    exec_answer,
    file_answer,
    sandbox_answer,
    sandbox_tools,
    too_large,
)
from api.mcp.sandbox_output import with_output
from api.problems import Problem
from api.sandbox_schemas import ExecCreate, SandboxCreate, SandboxOut
from runyard.registry.tools import ToolSpec
from runyard.runner import RunnerUnavailable
from runyard.sandboxes.files import SandboxFiles
from runyard.tenancy.auth import Principal, may_run

if TYPE_CHECKING:
    from api.mcp.providers import ToolCall


# A new sandbox is waited for until it runs (or ends), a closed one until it ended, within
# the server's longest wait; its status is read again at least this often.
READY_POLL_SECONDS = 0.2
READY_POLL_MAX_SECONDS = 1.0

M = TypeVar("M", bound=BaseModel)
Handler = Callable[["ToolCall"], Awaitable[types.CallToolResult]]


def _bad_argument(exc: ValidationError) -> Problem:
    """The first error of a tool's arguments, naming the argument at fault."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first.get("loc", ())) or "arguments"
    message = str(first.get("msg", "invalid"))
    if first.get("type") == "extra_forbidden":
        message = "no such argument"
    return Problem(422, "invalid_input", f"{field}: {message}", field=field)


def _sandbox_id(arguments: dict[str, Any]) -> uuid.UUID:
    """The ``sandbox_id`` argument; 422 if it is not a UUID."""
    return _uuid_argument(arguments, "sandbox_id", "a sandbox id")


def _uuid_argument(arguments: dict[str, Any], name: str, what: str) -> uuid.UUID:
    """The argument ``name`` as a UUID; 422 if it is not one."""
    try:
        return uuid.UUID(str(arguments.get(name)))
    except ValueError:
        raise Problem(422, "invalid_input", f"{name}: not {what} (a UUID)", field=name) from None


def _only(arguments: dict[str, Any], allowed: set[str]) -> None:
    """422 for an argument the tool does not take."""
    unknown = sorted(set(arguments) - allowed)
    if unknown:
        raise Problem(422, "invalid_input", f"{unknown[0]}: no such argument", field=unknown[0])


def _text_argument(arguments: dict[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise Problem(422, "invalid_input", f"{name}: a string is required", field=name)
    return value


def _model(model: type[M], arguments: dict[str, Any], allowed: set[str]) -> M:
    """The REST request model of the arguments (its own validation, its own limits)."""
    _only(arguments, allowed)
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise _bad_argument(exc) from exc


def _allows_sandboxes(tool: ToolSpec | None) -> bool:
    return tool is not None and tool.sandbox


class SandboxTools:
    """``runyard_sandbox_*``: sandboxes of the tools with ``sandbox = true``, in queue mode.
    Listed to a key that may run at least one such tool; answered to any key (the actions
    refuse what it may not do)."""

    def __init__(self, services: Services, files: Callable[[], SandboxFiles]) -> None:
        self._services = services
        self._files = files
        self._handlers: dict[str, Handler] = {
            CREATE_TOOL: self._create,
            EXEC_TOOL: self._exec,
            GET_EXEC_TOOL: self._get_exec,
            READ_FILE_TOOL: self._read_file,
            WRITE_FILE_TOOL: self._write_file,
            CLOSE_TOOL: self._close,
        }

    def _sandbox_tools(self, principal: Principal) -> list[str]:
        """The tools the caller may hold sandboxes of."""
        registry = self._services.registry
        return [
            name
            for name in registry.names()
            if may_run(principal, name) and _allows_sandboxes(registry.get(name))
        ]

    def tools(self, principal: Principal) -> list[types.Tool]:
        """The sandbox tools, if this API runs in queue mode and the caller may hold a
        sandbox of some tool (the create tool lists which)."""
        if self._services.sync is not None:
            return []
        allowed = self._sandbox_tools(principal)
        if not allowed:
            return []
        return sandbox_tools(allowed)

    async def call(self, call: ToolCall) -> types.CallToolResult | None:
        """The answer to a sandbox tool; None for another tool, or in sync mode."""
        handler = self._handlers.get(call.name)
        if handler is None or self._services.sync is not None:
            return None
        try:
            return await handler(call)
        except Problem as problem:
            return problem_answer(problem)

    async def _create(self, call: ToolCall) -> types.CallToolResult:
        principal, arguments = call.principal, call.arguments
        allowed = {"tool", "ttl_seconds", "idle_timeout_seconds", "env"}
        body = _model(SandboxCreate, arguments, allowed)
        created = await anyio.to_thread.run_sync(
            actions.create_sandbox, self._services, principal, body, call.idempotency_key
        )
        started = await self._until(principal, created.id, lambda out: out.status != "starting")
        return sandbox_answer(started, ended_is_error=True)

    async def _until(
        self, principal: Principal, sandbox_id: uuid.UUID, settled: Callable[[SandboxOut], bool]
    ) -> SandboxOut:
        """The sandbox once ``settled``, or as it is after the server's longest wait."""
        services = self._services
        give_up = anyio.current_time() + services.settings.max_wait_seconds
        pause = READY_POLL_SECONDS
        with services.notifier.subscribe(sandbox_id) as woken:
            while True:
                row = await anyio.to_thread.run_sync(
                    actions.load_sandbox, services, principal, sandbox_id
                )
                out = actions.sandbox_out(row)
                if settled(out) or anyio.current_time() >= give_up:
                    return out
                await woken.wait(min(pause, max(0.0, give_up - anyio.current_time())))
                pause = min(pause * 2, READY_POLL_MAX_SECONDS)

    async def _exec(self, call: ToolCall) -> types.CallToolResult:
        arguments = call.arguments
        sandbox_id = _sandbox_id(arguments)
        rest = {name: value for name, value in arguments.items() if name != "sandbox_id"}
        body = _model(ExecCreate, rest, {"command", "stdin", "env", "cwd", "timeout_seconds"})
        created = await anyio.to_thread.run_sync(
            actions.create_exec, self._services, call.principal, sandbox_id, body
        )
        return await self._answer_exec(call, sandbox_id, created.id)

    async def _get_exec(self, call: ToolCall) -> types.CallToolResult:
        arguments = call.arguments
        _only(arguments, {"sandbox_id", "exec_id"})
        sandbox_id = _sandbox_id(arguments)
        exec_id = _uuid_argument(arguments, "exec_id", "a command's id")
        return await self._answer_exec(call, sandbox_id, exec_id)

    async def _answer_exec(
        self, call: ToolCall, sandbox_id: uuid.UUID, exec_id: uuid.UUID
    ) -> types.CallToolResult:
        """The command once it finished, or as it is after the server's longest wait (as
        the REST ``?wait=`` holds it); its output as progress meanwhile, if asked for."""
        services = self._services
        # Checked before any output is sent: the output follower reads by the command's id.
        await anyio.to_thread.run_sync(
            actions.load_exec, services, call.principal, sandbox_id, exec_id
        )
        started = anyio.current_time()
        found = await with_output(
            services,
            (sandbox_id, exec_id),
            call.progress,
            functools.partial(
                actions.await_exec,
                services,
                call.principal,
                sandbox_id,
                exec_id,
                services.settings.max_wait_seconds,
            ),
        )
        return exec_answer(found, waited_seconds=anyio.current_time() - started)

    def _files_here(self) -> SandboxFiles:
        try:
            return self._files()
        except RunnerUnavailable as exc:
            raise Problem(503, "engine_unavailable", f"the container engine: {exc}") from exc

    async def _read_file(self, call: ToolCall) -> types.CallToolResult:
        principal, arguments = call.principal, call.arguments
        _only(arguments, {"sandbox_id", "path"})
        sandbox_id = _sandbox_id(arguments)
        path = _text_argument(arguments, "path")
        data = await anyio.to_thread.run_sync(self._read_capped, principal, sandbox_id, path)
        return file_answer(sandbox_id, path, data)

    def _read_capped(self, principal: Principal, sandbox_id: uuid.UUID, path: str) -> bytes:
        """The file's bytes, at most ``MAX_FILE_BYTES``; 413 past them, 422 for a
        directory (both say which REST route serves them)."""
        actions.load_sandbox(self._services, principal, sandbox_id)
        files = self._files_here()
        found = actions.get_file(self._services, principal, files, sandbox_id, path)
        chunks = found.chunks
        try:
            if found.is_dir:
                raise Problem(
                    422,
                    "is_a_directory",
                    f"{path} is a directory: list it with {EXEC_TOOL} (ls), or download it "
                    f"as a tar from GET /v1/sandboxes/{sandbox_id}/files/{path}",
                    field="path",
                )
            data = bytearray()
            for chunk in chunks:
                data += chunk
                if len(data) > MAX_FILE_BYTES:
                    raise too_large(sandbox_id, path, "read", "GET")
            return bytes(data)
        finally:
            if isinstance(chunks, Generator):
                chunks.close()  # let go of the engine's stream of a file not read to its end

    async def _write_file(self, call: ToolCall) -> types.CallToolResult:
        principal, arguments = call.principal, call.arguments
        _only(arguments, {"sandbox_id", "path", "content", "encoding"})
        sandbox_id = _sandbox_id(arguments)
        path = _text_argument(arguments, "path")
        encoding = arguments.get("encoding", "text")
        data = decoded_content(_text_argument(arguments, "content"), encoding)
        if len(data) > MAX_FILE_BYTES:
            raise too_large(sandbox_id, path, "written", "PUT")
        stored = await anyio.to_thread.run_sync(self._write, principal, sandbox_id, path, data)
        text = f"wrote {stored['size']} bytes to {stored['path']} in sandbox {sandbox_id}"
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content=stored
        )

    def _write(
        self, principal: Principal, sandbox_id: uuid.UUID, path: str, data: bytes
    ) -> dict[str, object]:
        actions.load_sandbox(self._services, principal, sandbox_id)
        files = self._files_here()
        return actions.put_file(
            self._services, principal, files, sandbox_id, path, io.BytesIO(data), len(data)
        )

    async def _close(self, call: ToolCall) -> types.CallToolResult:
        principal, arguments = call.principal, call.arguments
        _only(arguments, {"sandbox_id"})
        sandbox_id = _sandbox_id(arguments)
        await anyio.to_thread.run_sync(
            actions.delete_sandbox, self._services, principal, sandbox_id
        )
        # Its owner stops the container at its next renewal: the answer waits for that.
        ended = await self._until(principal, sandbox_id, lambda out: out.status == "ended")
        return sandbox_answer(ended)
