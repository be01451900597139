"""Sandboxes in the fake API: in memory, ready at once, each command answered at once by a
Python callable (``FakeBackend(sandbox_commands=...)``), files kept in a dict.

A command handler gets a ``FakeExecCall`` and returns ``(exit_code, stdout, stderr)``;
without one every command exits 0 and prints nothing. Not modelled: TTL and idle ends,
``max_execs``, secrets, the engine.
"""

from __future__ import annotations

import base64
import io
import json
import re
import tarfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import unquote

import httpx2

from runyard_client.testing._backend import FakeProblem, replayed

WORKSPACE = "/runyard/out/workspace"
T = TypeVar("T")


@dataclass(frozen=True)
class FakeExecCall:
    """What a command handler is given: the command, its input and the sandbox's files."""

    command: list[str]
    stdin: bytes
    env: dict[str, str]
    cwd: str
    files: dict[str, bytes]


FakeCommand = Callable[[FakeExecCall], tuple[int, str, str]]


def _nothing(call: FakeExecCall) -> tuple[int, str, str]:
    return 0, "", ""


@dataclass
class FakeSandbox:
    """One sandbox of the fake API."""

    id: uuid.UUID
    tool: str
    created_at: datetime
    idle_timeout_seconds: int
    max_execs: int
    files: dict[str, bytes] = field(default_factory=dict)
    execs: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    ended_at: datetime | None = None

    def view(self) -> dict[str, Any]:
        """As ``GET /v1/sandboxes/{id}`` shows it."""
        return {
            "id": str(self.id),
            "tool": self.tool,
            "status": "ended" if self.ended_at else "running",
            "end_reason": "deleted" if self.ended_at else None,
            "error": "the sandbox was deleted" if self.ended_at else None,
            "created_at": self.created_at.isoformat(),
            "started_at": self.created_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "expires_at": None,
            "idle_timeout_seconds": self.idle_timeout_seconds,
            "last_active_at": self.created_at.isoformat(),
            "max_execs": self.max_execs,
        }


class FakeSandboxes:
    """The sandboxes of one fake backend, and how their commands are answered."""

    def __init__(self, commands: FakeCommand | None = None) -> None:
        self.commands = commands or _nothing
        self.sandboxes: dict[uuid.UUID, FakeSandbox] = {}
        # Idempotency keys of creates: the body sent first and the sandbox it made.
        self.keys: dict[str, tuple[Any, uuid.UUID]] = {}

    def find(self, sandbox_id: str) -> FakeSandbox:
        """A sandbox, or 404."""
        return _lookup(self.sandboxes, sandbox_id, "sandbox")


def _lookup(found: dict[uuid.UUID, T], raw: str, what: str) -> T:
    """``found[raw]``, or a 404 ``<what>_not_found``."""
    try:
        value = found.get(uuid.UUID(raw))
    except ValueError:
        value = None
    if value is None:
        raise FakeProblem(404, f"{what}_not_found", f"no {what} {raw}")
    return value


def _json(body: Any, status: int = 200) -> httpx2.Response:
    return httpx2.Response(
        status, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )


def _now() -> datetime:
    return datetime.now(UTC)


def _path(raw: str) -> str:
    path = unquote(raw).strip("/")
    if any(part in ("", ".", "..") for part in path.split("/")) and path:
        raise FakeProblem(422, "invalid_path", "path: has an empty, '.' or '..' component")
    return path


def create(store: FakeSandboxes, tools: set[str], request: httpx2.Request) -> httpx2.Response:
    """``POST /v1/sandboxes``: any registered tool, running at once."""
    body = json.loads(request.content or b"{}")
    key = request.headers.get("idempotency-key")
    first = replayed(store.keys, key, body, "request")
    if first is not None:
        return _json(store.sandboxes[first].view(), 201)
    if body.get("tool") not in tools:
        raise FakeProblem(422, "unknown_tool", f"unknown tool {body.get('tool')!r}", field="tool")
    made = FakeSandbox(
        uuid.uuid4(),
        str(body["tool"]),
        _now(),
        int(body.get("idle_timeout_seconds") or 300),
        int(body.get("max_execs") or 4),
    )
    store.sandboxes[made.id] = made
    if key is not None:
        store.keys[key] = (body, made.id)
    return _json(made.view(), 201)


def run_exec(store: FakeSandboxes, request: httpx2.Request, sandbox_id: str) -> httpx2.Response:
    """``POST .../exec``: answered by the command handler at once (``finished``)."""
    box = store.find(sandbox_id)
    if box.ended_at is not None:
        raise FakeProblem(409, "sandbox_ended", f"sandbox {sandbox_id} has ended")
    body = json.loads(request.content or b"{}")
    stdin = (
        base64.b64decode(body["stdin_base64"])
        if body.get("stdin_base64") is not None
        else str(body.get("stdin", "")).encode()
    )
    cwd = f"{WORKSPACE}/{body['cwd']}" if body.get("cwd") else WORKSPACE
    call = FakeExecCall(list(body["command"]), stdin, dict(body.get("env") or {}), cwd, box.files)
    code, stdout, stderr = store.commands(call)
    at = _now().isoformat()
    done = {
        "id": str(uuid.uuid4()),
        "sandbox_id": str(box.id),
        "command": call.command,
        "cwd": cwd,
        "status": "finished",
        "exit_code": code,
        "timed_out": False,
        "error": None,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": False,
        "created_at": at,
        "started_at": at,
        "finished_at": at,
    }
    box.execs[uuid.UUID(str(done["id"]))] = done
    return _json(done, 202)


def _exec(store: FakeSandboxes, sandbox_id: str, exec_id: str) -> dict[str, Any]:
    return _lookup(store.find(sandbox_id).execs, exec_id, "exec")


def get_exec(
    store: FakeSandboxes, request: httpx2.Request, sandbox_id: str, exec_id: str
) -> httpx2.Response:
    """``GET .../execs/{id}``."""
    return _json(_exec(store, sandbox_id, exec_id))


def exec_events(
    store: FakeSandboxes, request: httpx2.Request, sandbox_id: str, exec_id: str
) -> httpx2.Response:
    """``GET .../execs/{id}/events``: its output then its exit, in one answer."""
    done = _exec(store, sandbox_id, exec_id)
    out, err = done["stdout"].encode(), done["stderr"].encode()
    parts = ["retry: 100\n\n"]
    if out:
        parts.append(
            f"id: {len(out)}-0\nevent: stdout\ndata: {json.dumps({'text': done['stdout']})}\n\n"
        )
    if err:
        text = json.dumps({"text": done["stderr"]})
        parts.append(f"id: {len(out)}-{len(err)}\nevent: stderr\ndata: {text}\n\n")
    end = {"exit_code": done["exit_code"], "timed_out": False, "error": None, "truncated": False}
    parts.append(f"id: {len(out)}-{len(err)}\nevent: exit\ndata: {json.dumps(end)}\n\n")
    return httpx2.Response(
        200, content="".join(parts).encode(), headers={"content-type": "text/event-stream"}
    )


def put_file(
    store: FakeSandboxes, request: httpx2.Request, sandbox_id: str, path: str
) -> httpx2.Response:
    """``PUT .../files/{path}``."""
    box = store.find(sandbox_id)
    name = _path(path)
    box.files[name] = bytes(request.content)
    return _json({"path": name, "size": len(request.content)})


def get_file(
    store: FakeSandboxes, request: httpx2.Request, sandbox_id: str, path: str
) -> httpx2.Response:
    """``GET .../files/{path}``: a file's bytes, or the files under a directory as a tar."""
    box = store.find(sandbox_id)
    name = _path(path)
    if name in box.files:
        return httpx2.Response(200, content=box.files[name])
    prefix = f"{name}/" if name else ""
    inside = {k: v for k, v in box.files.items() if k.startswith(prefix)}
    if not inside:
        raise FakeProblem(404, "file_not_found", f"no {name or '/'} in the workspace")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key, data in sorted(inside.items()):
            info = tarfile.TarInfo(key)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return httpx2.Response(
        200, content=buffer.getvalue(), headers={"content-type": "application/x-tar"}
    )


def get_sandbox(store: FakeSandboxes, request: httpx2.Request, sandbox_id: str) -> httpx2.Response:
    """``GET /v1/sandboxes/{id}``."""
    return _json(store.find(sandbox_id).view())


def list_sandboxes(store: FakeSandboxes, request: httpx2.Request) -> httpx2.Response:
    """``GET /v1/sandboxes``, newest first."""
    boxes = sorted(store.sandboxes.values(), key=lambda b: b.created_at, reverse=True)
    return _json({"sandboxes": [b.view() for b in boxes]})


def delete_sandbox(
    store: FakeSandboxes, request: httpx2.Request, sandbox_id: str
) -> httpx2.Response:
    """``DELETE /v1/sandboxes/{id}``: ended at once, its record kept."""
    box = store.find(sandbox_id)
    box.ended_at = box.ended_at or _now()
    return _json(box.view())


_ID = r"(?P<sandbox_id>[^/]+)"
_EXEC = r"(?P<exec_id>[^/]+)"
# (method, path pattern, handler), as the fake API's own routes.
SANDBOX_ROUTES: list[tuple[str, re.Pattern[str], Callable[..., httpx2.Response]]] = [
    ("GET", re.compile(r"/v1/sandboxes"), list_sandboxes),
    ("GET", re.compile(rf"/v1/sandboxes/{_ID}"), get_sandbox),
    ("DELETE", re.compile(rf"/v1/sandboxes/{_ID}"), delete_sandbox),
    ("POST", re.compile(rf"/v1/sandboxes/{_ID}/exec"), run_exec),
    ("GET", re.compile(rf"/v1/sandboxes/{_ID}/execs/{_EXEC}"), get_exec),
    ("GET", re.compile(rf"/v1/sandboxes/{_ID}/execs/{_EXEC}/events"), exec_events),
    ("PUT", re.compile(rf"/v1/sandboxes/{_ID}/files/(?P<path>.+)"), put_file),
    ("GET", re.compile(rf"/v1/sandboxes/{_ID}/files/(?P<path>.*)"), get_file),
]


def handle_sandboxes(
    store: FakeSandboxes, tools: set[str], request: httpx2.Request, path: str
) -> httpx2.Response | None:
    """The answer of a sandbox route, or None when ``path`` is not one."""
    if request.method == "POST" and path == "/v1/sandboxes":
        return create(store, tools, request)
    for method, pattern, handler in SANDBOX_ROUTES:
        match = pattern.fullmatch(path)
        if match is not None and method == request.method:
            return handler(store, request, **match.groupdict())
    return None
