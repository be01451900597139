"""The fake's HTTP face: the ``/v1`` routes the clients use, answered from a ``FakeBackend``
with the API's status codes, headers and problem documents (an ``httpx2.MockTransport``
handler, so the real clients run unchanged against it)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, unquote

import anyio
import httpx2

from runyard_client.testing import _batches as batches
from runyard_client.testing._backend import (
    ACTIVE,
    MAX_WAIT_QUERY,
    MAX_WAIT_SECONDS,
    FakeBackend,
    FakeBatch,
    FakeProblem,
    FakeRun,
)
from runyard_client.testing._backend import replayed as replayed_id
from runyard_client.testing._sandboxes import handle_sandboxes

RUN_FIELDS = frozenset(
    {"tool", "input", "priority", "limits", "callback_url", "depends_on", "run_at"}
)
LIMIT_FIELDS = frozenset({"timeout_seconds", "memory_mb", "cpus"})
PROBLEM_JSON = "application/problem+json"
Handler = Callable[..., "httpx2.Response | Hold"]
# How often a held answer looks again whether its run has ended.
HOLD_STEP_SECONDS = 0.05


@dataclass(frozen=True)
class Hold:
    """An answer the API holds (``?wait=``): given once ``ready()`` or after ``seconds``."""

    seconds: float
    ready: Callable[[], bool]
    answer: Callable[[], httpx2.Response]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx2.Response:
    content = json.dumps(body, default=_default).encode()
    return httpx2.Response(
        status, content=content, headers={"content-type": "application/json", **(headers or {})}
    )


def _default(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _problem(exc: FakeProblem) -> httpx2.Response:
    extra = dict(exc.extra)
    headers = extra.pop("headers", {})
    body = {"type": "about:blank", "title": exc.code, "status": exc.status, "code": exc.code}
    content = json.dumps({**body, "detail": exc.detail, **extra}).encode()
    return httpx2.Response(
        exc.status, content=content, headers={"content-type": PROBLEM_JSON, **headers}
    )


def _invalid(field: str, message: str) -> FakeProblem:
    return FakeProblem(422, "validation_error", f"{field}: {message}", field=field)


def _uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _invalid(field, "Input should be a valid UUID") from None


def _int(body: dict[str, Any], name: str, low: int, high: int, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(name, f"Input should be an integer from {low} to {high}")
    return value


def run_request(body: Any, *, batch_item: bool = False) -> dict[str, Any]:
    """The checked fields of a run's request (the API's strict rules, without JSON schemas)."""
    if not isinstance(body, dict):
        raise _invalid("body", "Input should be a valid dictionary")
    allowed = RUN_FIELDS | {"ref"} if batch_item else RUN_FIELDS
    for name in body:
        if name not in allowed:
            raise _invalid(name, "Extra inputs are not permitted")
    if not isinstance(body.get("tool"), str) or not body["tool"]:
        raise _invalid("tool", "Field required")
    request = {"tool": body["tool"], "input": body.get("input", {})}
    request["priority"] = _int(body, "priority", -100, 100, 0)
    limits = body.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - LIMIT_FIELDS:
        raise _invalid("limits", "Extra inputs are not permitted")
    request["limits"] = limits
    request["callback_url"] = body.get("callback_url")
    depends = body.get("depends_on", [])
    if not isinstance(depends, list) or not all(isinstance(dep, str) for dep in depends):
        raise _invalid("depends_on", "Input should be a valid list of strings")
    request["depends_on"] = (
        depends if batch_item else [_uuid(dep, "depends_on") for dep in dict.fromkeys(depends)]
    )
    if body.get("run_at") is not None:
        try:
            run_at = datetime.fromisoformat(str(body["run_at"]))
        except ValueError:
            raise _invalid("run_at", "Input should be a valid datetime") from None
        if run_at.tzinfo is None:
            raise _invalid("run_at", "Input should have timezone info")
        request["run_at"] = run_at
    if batch_item:
        request["ref"] = body.get("ref")
    return request


def _wait(request: httpx2.Request) -> float:
    """The ``wait`` query of a long-poll, checked as the API does; capped as it caps it."""
    text = request.url.params.get("wait", "0") or "0"
    try:
        wait = float(text)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or not 0 <= wait <= MAX_WAIT_QUERY:
        raise _invalid("wait", f"Input should be a finite number from 0 to {MAX_WAIT_QUERY:g}")
    return min(wait, MAX_WAIT_SECONDS)


def _held(
    backend: FakeBackend,
    wait: float,
    ended: Callable[[], bool],
    answer: Callable[[], httpx2.Response],
) -> httpx2.Response | Hold:
    """The answer now (no ``wait``), or held up to ``wait`` seconds while the instant worker
    may end what it waits for (a ``run_at`` passing, ``run_pending()`` from elsewhere)."""
    if wait <= 0:
        return answer()

    def ready() -> bool:
        with backend.lock:
            backend.tick()
            return ended()

    return Hold(wait, ready, answer)


def _body(request: httpx2.Request) -> Any:
    try:
        return json.loads(request.content or b"null")
    except ValueError:
        raise FakeProblem(400, "invalid_json", "the body is not JSON") from None


def submit_run(backend: FakeBackend, request: httpx2.Request) -> httpx2.Response | Hold:
    body = _body(request)
    fields = run_request(body)
    wait = _wait(request)
    key = request.headers.get("idempotency-key")
    first = replayed_id(backend.keys, key, body, "request")
    replayed = first is not None
    if first is not None:
        run = backend.find(first)
    else:
        run = backend.create(fields)
        if key is not None:
            backend.keys[key] = (body, run.id)
    headers = {"Location": f"/v1/runs/{run.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"

    def answer() -> httpx2.Response:
        with backend.lock:
            ended = run.status not in ACTIVE
            return _json(backend.view(run), 200 if ended else 202, headers)

    return _held(backend, wait, lambda: run.status not in ACTIVE, answer)


def list_runs(backend: FakeBackend, request: httpx2.Request) -> httpx2.Response:
    params = request.url.params
    limit = _int({"limit": int(params.get("limit", "50"))}, "limit", 1, 200, 50)
    runs = sorted(backend.runs.values(), key=lambda r: (r.requested_at, r.id), reverse=True)
    runs = [
        run
        for run in runs
        if all(
            params.get(name) in (None, value)
            for name, value in (("status", run.status), ("tool", run.tool), ("mode", "queue"))
        )
    ]
    start = 0
    if params.get("cursor"):
        try:
            start = int(params["cursor"].removeprefix("c"))
        except ValueError:
            raise FakeProblem(400, "invalid_cursor", "not a cursor", field="cursor") from None
    page = runs[start : start + limit]
    more = start + limit < len(runs)
    next_cursor = f"c{start + limit}" if more else None
    return _json({"items": [backend.view(run) for run in page], "next_cursor": next_cursor})


def _run(backend: FakeBackend, run_id: str) -> FakeRun:
    return backend.find(_uuid(run_id, "run_id"))


def get_run(backend: FakeBackend, request: httpx2.Request, run_id: str) -> httpx2.Response | Hold:
    wait = _wait(request)
    run = _run(backend, run_id)

    def answer() -> httpx2.Response:
        with backend.lock:
            return _json(backend.view(run))

    return _held(backend, wait, lambda: run.status not in ACTIVE, answer)


def cancel_run(backend: FakeBackend, request: httpx2.Request, run_id: str) -> httpx2.Response:
    run = _run(backend, run_id)
    backend.cancel(run)
    return _json(backend.view(run), 202)


def rerun(backend: FakeBackend, request: httpx2.Request, run_id: str) -> httpx2.Response:
    old = _run(backend, run_id)
    fields = {"tool": old.tool, "input": old.input, "priority": old.priority}
    run = backend.create(fields | {"callback_url": old.callback_url}, rerun_of=old.id)
    return _json(backend.view(run), 202, {"Location": f"/v1/runs/{run.id}"})


def delete_run(backend: FakeBackend, request: httpx2.Request, run_id: str) -> httpx2.Response:
    backend.delete(_run(backend, run_id))
    return httpx2.Response(204)


def run_logs(backend: FakeBackend, request: httpx2.Request, run_id: str) -> httpx2.Response:
    run = _run(backend, run_id)
    stream = request.url.params.get("stream", "both")
    streams = ("stdout", "stderr") if stream == "both" else (stream,)
    text = "".join(run.stdout if name == "stdout" else run.stderr for name in streams)
    headers = {"content-type": "text/plain; charset=utf-8", "X-Runyard-Run-Status": run.status}
    return httpx2.Response(200, content=text.encode(), headers=headers)


def run_events(backend: FakeBackend, request: httpx2.Request, run_id: str) -> httpx2.Response:
    run = _run(backend, run_id)
    after = int(request.headers.get("last-event-id") or request.url.params.get("after") or 0)
    events = [event for event in run.events if event.id > after]
    ended = run.status not in ("queued", "running")
    if request.url.params.get("format") == "ndjson":
        lines = [
            json.dumps({"id": e.id, "type": e.type, "at": e.at, "data": e.data}, default=_default)
            for e in events
        ]
        body = "".join(line + "\n" for line in lines).encode()
        return httpx2.Response(200, content=body, headers={"content-type": "application/x-ndjson"})
    if ended and not events:
        return httpx2.Response(204)
    # A stream ends after what is there now; the client resumes after the last id.
    parts = ["retry: 100\n\n"]
    for event in events:
        data = json.dumps({"at": event.at, **event.data}, default=_default)
        parts.append(f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n")
    return httpx2.Response(
        200, content="".join(parts).encode(), headers={"content-type": "text/event-stream"}
    )


def list_artifacts(backend: FakeBackend, request: httpx2.Request, run_id: str) -> httpx2.Response:
    run = _run(backend, run_id)
    backend.ended(run)
    files = [
        {
            "path": path,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "url": f"/v1/runs/{run.id}/artifacts/{quote(path, safe='/')}",
        }
        for path, data in sorted(run.files.items())
    ]
    return _json(
        {
            "run_id": str(run.id),
            "count": len(files),
            "total_bytes": sum(len(data) for data in run.files.values()),
            "tar_url": f"/v1/runs/{run.id}/artifacts.tar",
            "artifacts": files,
        }
    )


def download(
    backend: FakeBackend, request: httpx2.Request, run_id: str, path: str
) -> httpx2.Response:
    run = _run(backend, run_id)
    backend.ended(run)
    data = run.files.get(unquote(path))
    if data is None:
        raise FakeProblem(404, "artifact_not_found", f"the run has no artifact {unquote(path)!r}")
    headers = {"content-type": "application/octet-stream", "accept-ranges": "bytes"}
    headers["etag"] = f'"{hashlib.sha256(data).hexdigest()}"'
    wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", request.headers.get("range", ""))
    if wanted is None or wanted.groups() == ("", ""):
        return httpx2.Response(200, content=data, headers=headers)
    first, last = wanted.groups()
    start = len(data) - int(last) if not first else int(first)
    stop = len(data) if not first or not last else min(int(last) + 1, len(data))
    if start >= len(data):
        raise FakeProblem(
            416,
            "range_not_satisfiable",
            "the range starts past the end of the file",
            headers={"Content-Range": f"bytes */{len(data)}"},
        )
    headers["content-range"] = f"bytes {max(start, 0)}-{stop - 1}/{len(data)}"
    return httpx2.Response(206, content=data[max(start, 0) : stop], headers=headers)


def submit_batch(backend: FakeBackend, request: httpx2.Request) -> httpx2.Response:
    body = _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("runs"), list) or not body["runs"]:
        raise _invalid("runs", "List should have at least 1 item")
    items = [run_request(item, batch_item=True) for item in body["runs"]]
    key = request.headers.get("idempotency-key")
    first = replayed_id(backend.keys, key, body, "batch")
    if first is not None:
        batch = batches.find(backend, first)
    else:
        batch = batches.submit(backend, items, body.get("callback_url"))
        if key is not None:
            backend.keys[key] = (body, batch.id)
    answer = batches.view(backend, batch) | {"run_ids": batch.refs}
    return _json(answer, 202, {"Location": f"/v1/batches/{batch.id}"})


def _batch(backend: FakeBackend, batch_id: str) -> FakeBatch:
    return batches.find(backend, _uuid(batch_id, "batch_id"))


def get_batch(
    backend: FakeBackend, request: httpx2.Request, batch_id: str
) -> httpx2.Response | Hold:
    wait = _wait(request)
    batch = _batch(backend, batch_id)

    def answer() -> httpx2.Response:
        with backend.lock:
            return _json(batches.view(backend, batch))

    return _held(backend, wait, lambda: batches.ended(backend, batch), answer)


def list_batches(backend: FakeBackend, request: httpx2.Request) -> httpx2.Response:
    limit = int(request.url.params.get("limit", "20"))
    start = int(request.url.params.get("cursor", "c0").removeprefix("c"))
    found = sorted(backend.batches.values(), key=lambda b: (b.created_at, b.id), reverse=True)
    page = found[start : start + limit]
    more = start + limit < len(found)
    items = [batches.view(backend, batch, with_runs=False) for batch in page]
    return _json({"items": items, "next_cursor": f"c{start + limit}" if more else None})


def cancel_batch(backend: FakeBackend, request: httpx2.Request, batch_id: str) -> httpx2.Response:
    batch = _batch(backend, batch_id)
    batches.cancel(backend, batch)
    return _json(batches.view(backend, batch), 202)


def retry_batch(backend: FakeBackend, request: httpx2.Request, batch_id: str) -> httpx2.Response:
    batch = _batch(backend, batch_id)
    made = batches.retry(backend, batch)
    return _json(batches.view(backend, batch) | {"run_ids": made}, 202)


def list_tools(backend: FakeBackend, request: httpx2.Request) -> httpx2.Response:
    limits = {"timeout_seconds": 30, "memory_mb": 64, "cpus": 0.5}
    maxima = {f"max_{name}": value for name, value in limits.items()}
    return _json(
        [
            {"name": tool.name, "description": tool.description, "image": "fake"}
            | limits
            | {"pids_limit": 64, "max_attempts": 1, "network": "none", "queue": "default"}
            | maxima
            | {"input_schema": tool.input_schema, "build": None}
            for tool in backend.tools.values()
        ]
    )


# (method, path pattern, handler, whether the instant worker runs first)
ROUTES: list[tuple[str, re.Pattern[str], Handler, bool]] = [
    ("POST", re.compile(r"/v1/runs"), submit_run, False),
    ("GET", re.compile(r"/v1/runs"), list_runs, True),
    ("GET", re.compile(r"/v1/runs/(?P<run_id>[^/]+)"), get_run, True),
    ("DELETE", re.compile(r"/v1/runs/(?P<run_id>[^/]+)"), delete_run, True),
    ("POST", re.compile(r"/v1/runs/(?P<run_id>[^/]+)/cancel"), cancel_run, True),
    ("POST", re.compile(r"/v1/runs/(?P<run_id>[^/]+)/rerun"), rerun, True),
    ("GET", re.compile(r"/v1/runs/(?P<run_id>[^/]+)/logs"), run_logs, True),
    ("GET", re.compile(r"/v1/runs/(?P<run_id>[^/]+)/events"), run_events, True),
    ("GET", re.compile(r"/v1/runs/(?P<run_id>[^/]+)/artifacts"), list_artifacts, True),
    ("GET", re.compile(r"/v1/runs/(?P<run_id>[^/]+)/artifacts/(?P<path>.+)"), download, True),
    ("POST", re.compile(r"/v1/batches"), submit_batch, False),
    ("GET", re.compile(r"/v1/batches"), list_batches, True),
    ("GET", re.compile(r"/v1/batches/(?P<batch_id>[^/]+)"), get_batch, True),
    ("POST", re.compile(r"/v1/batches/(?P<batch_id>[^/]+)/cancel"), cancel_batch, True),
    ("POST", re.compile(r"/v1/batches/(?P<batch_id>[^/]+)/retry"), retry_batch, True),
    ("GET", re.compile(r"/v1/tools"), list_tools, True),
]


def handle(backend: FakeBackend, request: httpx2.Request) -> httpx2.Response | Hold:
    """Answer one request as the API would."""
    with backend.lock:
        try:
            if backend.api_key is not None:
                if request.headers.get("authorization") != f"Bearer {backend.api_key}":
                    raise FakeProblem(401, "invalid_api_key", "unknown or revoked API key")
            path = request.url.raw_path.decode().split("?", 1)[0]
            boxed = handle_sandboxes(backend.sandboxes, set(backend.tools), request, path)
            if boxed is not None:
                return boxed
            for method, pattern, handler, ticks in ROUTES:
                match = pattern.fullmatch(path)
                if match is not None and method == request.method:
                    if ticks:
                        backend.tick()
                    return handler(backend, request, **match.groupdict())
            raise FakeProblem(404, "not_found", f"no route {path}")
        except FakeProblem as exc:
            return _problem(exc)


class FakeTransport(httpx2.BaseTransport, httpx2.AsyncBaseTransport):
    """Answers every request from a ``FakeBackend``; a held answer sleeps (``time.sleep``
    for the blocking client, ``anyio.sleep`` for the async one) while its run may still end."""

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.read()
        answer = handle(self.backend, request)
        if not isinstance(answer, Hold):
            return answer
        deadline = time.monotonic() + answer.seconds
        while not answer.ready() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, HOLD_STEP_SECONDS))
        return answer.answer()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await request.aread()
        answer = handle(self.backend, request)
        if not isinstance(answer, Hold):
            return answer
        deadline = time.monotonic() + answer.seconds
        while not answer.ready() and (left := deadline - time.monotonic()) > 0:
            await anyio.sleep(min(left, HOLD_STEP_SECONDS))
        return answer.answer()
