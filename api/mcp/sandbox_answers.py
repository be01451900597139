"""The sandbox tools as MCP lists them (names, descriptions, input schemas) and what their
calls answer: a sandbox, a command with its output, a file's content, a refusal."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import mcp.types as types

from api.problems import Problem
from api.sandbox_schemas import ExecOut, SandboxOut

CREATE_TOOL = "runyard_sandbox_create"
EXEC_TOOL = "runyard_sandbox_exec"
GET_EXEC_TOOL = "runyard_sandbox_get_exec"
READ_FILE_TOOL = "runyard_sandbox_read_file"
WRITE_FILE_TOOL = "runyard_sandbox_write_file"
CLOSE_TOOL = "runyard_sandbox_close"
# A file read or written through MCP travels whole in one message: at most this many bytes
# (larger ones go over the REST file routes, which stream).
MAX_FILE_BYTES = 1_048_576
# A command's answer carries at most this many characters of each stream: the last ones
# (where errors and summaries are); the REST route has all that was kept.
MAX_OUTPUT_CHARS = 262_144
SANDBOX_ID_META = "io.runyard/sandbox_id"

_SANDBOX_ID = {"type": "string", "format": "uuid", "description": "The sandbox's id"}
_PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "Relative to the workspace: no leading '/', no '..', no link along the way",
}
_ENV = {
    "type": "object",
    "additionalProperties": {"type": "string"},
    "description": "More environment variables",
}


def _tool(name: str, description: str, properties: dict[str, Any], *required: str) -> types.Tool:
    """A tool whose arguments are ``properties`` (no others), ``required`` among them."""
    return types.Tool(
        name=name,
        description=description,
        input_schema={
            "type": "object",
            "properties": properties,
            "required": list(required),
            "additionalProperties": False,
        },
    )


def sandbox_tools(allowed: list[str]) -> list[types.Tool]:
    """The sandbox tools, for a caller who may hold sandboxes of the tools ``allowed``."""
    create = _tool(
        CREATE_TOOL,
        "Start a sandbox: a long-lived, hardened container of a tool where you run commands "
        "and read and write files. Answers once it runs (or after the server's longest "
        "wait) with its id; close it when done.",
        {
            "tool": {"type": "string", "enum": allowed, "description": "Whose container"},
            "ttl_seconds": {
                "type": "integer",
                "minimum": 1,
                "description": "Seconds it may live (up to the tool's maximum)",
            },
            "idle_timeout_seconds": {
                "type": "integer",
                "minimum": 1,
                "description": "Seconds without a command or a file access before it ends",
            },
            "env": {**_ENV, "description": "Environment of the container and its commands"},
        },
        "tool",
    )
    return [create, *_FIXED_TOOLS]


_FIXED_TOOLS = [
    _tool(
        EXEC_TOOL,
        "Run a command in a sandbox (in its workspace, also HOME) and answer its exit code, "
        "stdout and stderr once it finished, or its id if it runs past the server's longest "
        "wait.",
        {
            "sandbox_id": _SANDBOX_ID,
            "command": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": 'The program and its arguments, e.g. ["sh", "-c", "ls"]',
            },
            "stdin": {"type": "string", "description": "Text for its standard input"},
            "env": _ENV,
            "cwd": {**_PATH, "description": "Directory relative to the workspace"},
            "timeout_seconds": {
                "type": "integer",
                "minimum": 1,
                "maximum": 86_400,
                "description": "Killed after this (60)",
            },
        },
        "sandbox_id",
        "command",
    ),
    _tool(
        GET_EXEC_TOOL,
        f"A command that {EXEC_TOOL} left running: waits for it to finish (or the server's "
        "longest wait) and answers as that tool does.",
        {
            "sandbox_id": _SANDBOX_ID,
            "exec_id": {"type": "string", "format": "uuid", "description": "The command"},
        },
        "sandbox_id",
        "exec_id",
    ),
    _tool(
        READ_FILE_TOOL,
        f"A file of a sandbox's workspace: its text (base64 if it is not UTF-8), at most "
        f"{MAX_FILE_BYTES} bytes.",
        {"sandbox_id": _SANDBOX_ID, "path": _PATH},
        "sandbox_id",
        "path",
    ),
    _tool(
        WRITE_FILE_TOOL,
        f"Write a file into a sandbox's workspace (its directories made), at most "
        f"{MAX_FILE_BYTES} bytes (and within the server's request size).",
        {
            "sandbox_id": _SANDBOX_ID,
            "path": _PATH,
            "content": {"type": "string", "description": "The file's content"},
            "encoding": {
                "type": "string",
                "enum": ["text", "base64"],
                "description": "How content is written: text (UTF-8, the default) or base64",
            },
        },
        "sandbox_id",
        "path",
        "content",
    ),
    _tool(
        CLOSE_TOOL,
        "End a sandbox (its container stops; its record and its commands stay).",
        {"sandbox_id": _SANDBOX_ID},
        "sandbox_id",
    ),
]


def sandbox_answer(sandbox: SandboxOut, *, ended_is_error: bool = False) -> types.CallToolResult:
    """A sandbox as ``GET /v1/sandboxes/{id}`` shows it, and what to do next; a tool error
    if it ended and ``ended_is_error`` (a new one that could not start)."""
    text = f"sandbox {sandbox.id} of {sandbox.tool} is {sandbox.status}"
    if sandbox.status == "running":
        text += f"; run commands with {EXEC_TOOL}, close it with {CLOSE_TOOL} when done"
    elif sandbox.status == "starting":
        text += f"; {EXEC_TOOL} runs a command once it started"
    else:
        text += f" ({sandbox.end_reason})" if sandbox.end_reason else ""
        text += f": {sandbox.error}" if sandbox.error else ""
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=sandbox.model_dump(mode="json"),
        is_error=ended_is_error and sandbox.status == "ended",
        meta={SANDBOX_ID_META: str(sandbox.id)},
    )


def _tail(text: str) -> tuple[str, int]:
    """The last ``MAX_OUTPUT_CHARS`` of ``text`` and how many characters were left out."""
    left_out = max(0, len(text) - MAX_OUTPUT_CHARS)
    return text[left_out:], left_out


def exec_answer(found: ExecOut, *, waited_seconds: float) -> types.CallToolResult:
    """A command as a tool's answer: its exit code and output once finished (a tool error
    if it failed, timed out or its sandbox ended), how to fetch it while it runs."""
    stdout, stdout_cut = _tail(found.stdout)
    stderr, stderr_cut = _tail(found.stderr)
    where = f"GET /v1/sandboxes/{found.sandbox_id}/execs/{found.id}"
    structured: dict[str, Any] = {
        "sandbox_id": str(found.sandbox_id),
        "exec_id": str(found.id),
        "status": found.status,
        "exit_code": found.exit_code,
        "timed_out": found.timed_out,
        "error": found.error,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": found.truncated,
        "stdout_chars_left_out": stdout_cut,
        "stderr_chars_left_out": stderr_cut,
    }
    notes = []
    if found.status != "finished":
        notes.append(
            f"command {found.id} is still {found.status} after waiting {waited_seconds:.1f} s; "
            f'call {GET_EXEC_TOOL} with {{"sandbox_id": "{found.sandbox_id}", '
            f'"exec_id": "{found.id}"}} to wait for it, or {where}?wait=30'
        )
        head = f"command {found.id}: {found.status}"
    elif found.error:
        head = f"command {found.id}: {found.error}"
    else:
        head = f"exit code {found.exit_code}" + (" (timed out)" if found.timed_out else "")
    if found.truncated:
        notes.append("output past the tool's cap was not kept (truncated)")
    if stdout_cut or stderr_cut:
        notes.append(
            f"only the last {MAX_OUTPUT_CHARS} characters of each stream are here; {where} "
            "has all that was kept"
        )
    text = "\n".join([head, *notes, "--- stdout ---", stdout, "--- stderr ---", stderr])
    failed = found.status == "finished" and (
        found.exit_code != 0 or found.timed_out or found.error is not None
    )
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=structured,
        is_error=failed,
        meta={SANDBOX_ID_META: str(found.sandbox_id)},
    )


def file_answer(sandbox_id: uuid.UUID, path: str, data: bytes) -> types.CallToolResult:
    """A file's content: its text if it is UTF-8, base64 otherwise (``encoding`` says)."""
    try:
        content, encoding = data.decode("utf-8"), "text"
    except UnicodeDecodeError:
        content, encoding = base64.b64encode(data).decode("ascii"), "base64"
    return types.CallToolResult(
        content=[types.TextContent(text=content)],
        structured_content={
            "sandbox_id": str(sandbox_id),
            "path": path,
            "size": len(data),
            "encoding": encoding,
            "content": content,
        },
        meta={SANDBOX_ID_META: str(sandbox_id)},
    )


def decoded_content(content: str, encoding: object) -> bytes:
    """The bytes a write carries; 422 for an unknown encoding or bad base64."""
    if encoding == "text":
        try:
            return content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: not text any file could hold
            raise Problem(
                422, "invalid_input", "content: not UTF-8 text", field="content"
            ) from None
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise Problem(422, "invalid_input", "content: not base64", field="content") from None
    raise Problem(422, "invalid_input", "encoding: text or base64", field="encoding")


def too_large(sandbox_id: uuid.UUID, path: str, done: str, method: str) -> Problem:
    """413 for a file larger than MCP carries, naming the REST route that streams it."""
    return Problem(
        413,
        "file_too_large",
        f"{path} is larger than {MAX_FILE_BYTES} bytes, the most a file {done} through MCP "
        f"may have; use {method} /v1/sandboxes/{sandbox_id}/files/{path}",
        field="path",
    )
