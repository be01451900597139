"""Malformed and hostile requests: each gets its documented status and ``code``, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.registry.tools import ToolRegistry
from tests.integration.api.test_api_helpers import bearer, count, make_app

MAX_BYTES = 8192
JSON = {"content-type": "application/json"}
RUN = "/v1/runs/00000000-0000-4000-8000-000000000000"


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    status: int
    code: str
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    problem_field: str | None = None
    auth: bool = True


def _nested(depth: int) -> bytes:
    return b'{"tool": "echo", "input": ' + b"[" * depth + b"]" * depth + b"}"


def _chunks() -> Iterator[bytes]:
    for _ in range(10):
        yield b" " * 1024


CASES = [
    Case(
        "malformed JSON",
        "POST",
        "/v1/runs",
        400,
        "invalid_json",
        content=b'{"tool": "echo",',
        headers=JSON,
    ),
    Case(
        "invalid UTF-8",
        "POST",
        "/v1/runs",
        400,
        "invalid_json",
        content=b'{"tool": "\xff\xfe"}',
        headers=JSON,
    ),
    Case(
        "raw NUL byte in the body",
        "POST",
        "/v1/runs",
        400,
        "invalid_json",
        content=b'{"tool": "ec\x00ho"}',
        headers=JSON,
    ),
    Case(
        "NaN literal",
        "POST",
        "/v1/runs",
        400,
        "invalid_json",
        content=b'{"tool": "echo", "input": {"x": NaN}}',
        headers=JSON,
    ),
    Case(
        "number out of float range",
        "POST",
        "/v1/runs",
        400,
        "invalid_json",
        content=b'{"tool": "echo", "input": {"x": 1e400}}',
        headers=JSON,
    ),
    Case(
        "integer with 5000 digits",
        "POST",
        "/v1/runs",
        400,
        "invalid_json",
        content=b'{"tool": "echo", "input": {"x": ' + b"9" * 5000 + b"}}",
        headers=JSON,
    ),
    Case(
        "duplicate key",
        "POST",
        "/v1/runs",
        400,
        "duplicate_key",
        content=b'{"tool": "echo", "tool": "fail"}',
        headers=JSON,
        problem_field="tool",
    ),
    Case(
        "JSON deeper than 64",
        "POST",
        "/v1/runs",
        400,
        "json_too_deep",
        content=_nested(64),
        headers=JSON,
    ),
    Case(
        "JSON nested 100000 deep",
        "POST",
        "/v1/runs",
        400,
        "json_too_deep",
        content=_nested(1900),
        headers=JSON,
    ),
    Case(
        "escaped NUL in a value",
        "POST",
        "/v1/runs",
        422,
        "nul_character",
        content=b'{"tool": "echo", "input": {"a": "x\\u0000y"}}',
        headers=JSON,
        problem_field="input.a",
    ),
    Case(
        "escaped NUL in a key",
        "POST",
        "/v1/runs",
        422,
        "nul_character",
        content=b'{"tool": "echo", "input": {"a\\u0000": 1}}',
        headers=JSON,
    ),
    Case(
        "lone surrogate",
        "POST",
        "/v1/runs",
        422,
        "invalid_unicode",
        content=b'{"tool": "echo", "input": {"a": "\\ud800"}}',
        headers=JSON,
        problem_field="input.a",
    ),
    Case(
        "text/plain body",
        "POST",
        "/v1/runs",
        415,
        "unsupported_media_type",
        content=b"tool=echo",
        headers={"content-type": "text/plain"},
    ),
    Case(
        "no content type",
        "POST",
        "/v1/runs",
        415,
        "unsupported_media_type",
        content=b'{"tool": "echo"}',
    ),
    Case(
        "form body on cancel",
        "POST",
        f"{RUN}/cancel",
        415,
        "unsupported_media_type",
        content=b"a=1",
        headers={"content-type": "application/x-www-form-urlencoded"},
    ),
    Case(
        "body over the limit (Content-Length)",
        "POST",
        "/v1/runs",
        413,
        "body_too_large",
        content=b'{"tool": "echo", "input": "' + b"a" * MAX_BYTES + b'"}',
        headers=JSON,
    ),
    Case("body over the limit (chunked)", "POST", "/v1/runs", 413, "body_too_large", headers=JSON),
    Case(
        "priority true",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "priority": True},
        problem_field="priority",
    ),
    Case(
        "priority as string",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "priority": "5"},
        problem_field="priority",
    ),
    Case(
        "priority as float",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "priority": 1.5},
        problem_field="priority",
    ),
    Case(
        "priority out of bounds",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "priority": 101},
        problem_field="priority",
    ),
    Case(
        "unknown field image",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "image": "evil:latest"},
        problem_field="image",
    ),
    Case(
        "unknown field privileged",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "privileged": True},
        problem_field="privileged",
    ),
    Case(
        "unknown field env",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "env": {"LD_PRELOAD": "x"}},
        problem_field="env",
    ),
    Case(
        "unknown field mounts",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo", "mounts": ["/:/host"]},
        problem_field="mounts",
    ),
    Case(
        "missing tool",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"input": {}},
        problem_field="tool",
    ),
    Case(
        "tool name with a path",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "../../etc/passwd"},
        problem_field="tool",
    ),
    Case(
        "tool as number",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": 7},
        problem_field="tool",
    ),
    Case("body is an array", "POST", "/v1/runs", 422, "validation_error", json=[]),
    Case(
        "body is null", "POST", "/v1/runs", 422, "validation_error", content=b"null", headers=JSON
    ),
    Case(
        "unknown tool",
        "POST",
        "/v1/runs",
        422,
        "unknown_tool",
        json={"tool": "rm-rf"},
        problem_field="tool",
    ),
    Case(
        "input against the tool schema",
        "POST",
        "/v1/runs",
        422,
        "invalid_input",
        json={"tool": "sleep", "input": {}},
        problem_field="input",
    ),
    Case(
        "input field of the wrong type",
        "POST",
        "/v1/runs",
        422,
        "invalid_input",
        json={"tool": "sleep", "input": {"seconds": "forever"}},
        problem_field="input.seconds",
    ),
    Case(
        "negative wait",
        "POST",
        "/v1/runs?wait=-1",
        422,
        "validation_error",
        json={"tool": "echo"},
        problem_field="wait",
    ),
    Case(
        "wait NaN",
        "POST",
        "/v1/runs?wait=nan",
        422,
        "validation_error",
        json={"tool": "echo"},
        problem_field="wait",
    ),
    Case(
        "wait infinite",
        "POST",
        "/v1/runs?wait=inf",
        422,
        "validation_error",
        json={"tool": "echo"},
        problem_field="wait",
    ),
    Case(
        "Idempotency-Key too long",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo"},
        headers={"Idempotency-Key": "k" * 256},
        problem_field="Idempotency-Key",
    ),
    Case(
        "Idempotency-Key with spaces",
        "POST",
        "/v1/runs",
        422,
        "validation_error",
        json={"tool": "echo"},
        headers={"Idempotency-Key": "a b"},
        problem_field="Idempotency-Key",
    ),
    Case(
        "run id not a UUID",
        "GET",
        "/v1/runs/1%20OR%201=1",
        422,
        "validation_error",
        problem_field="run_id",
    ),
    Case("NUL in the query", "GET", "/v1/runs?tool=ec%00ho", 400, "nul_character"),
    Case(
        "limit as boolean",
        "GET",
        "/v1/runs?limit=true",
        422,
        "validation_error",
        problem_field="limit",
    ),
    Case(
        "tool filter with SQL",
        "GET",
        "/v1/runs?tool=x'%20OR%20'1'='1",
        422,
        "validation_error",
        problem_field="tool",
    ),
    Case(
        "Last-Event-ID not a number",
        "GET",
        f"{RUN}/events",
        422,
        "validation_error",
        headers={"Last-Event-ID": "abc"},
        problem_field="Last-Event-ID",
    ),
    Case(
        "Last-Event-ID past 2^63",
        "GET",
        f"{RUN}/events",
        422,
        "validation_error",
        headers={"Last-Event-ID": "9999999999999999999"},
        problem_field="Last-Event-ID",
    ),
    Case("unknown route", "GET", "/v1/secrets", 404, "not_found"),
    Case("wrong method", "DELETE", "/v1/runs", 405, "method_not_allowed"),
    Case("PUT on a run", "PUT", RUN, 405, "method_not_allowed", json={}),
    Case(
        "empty bearer",
        "GET",
        "/v1/runs",
        401,
        "unauthenticated",
        headers={"Authorization": "Bearer "},
        auth=False,
    ),
    Case(
        "forged key",
        "GET",
        "/v1/runs",
        401,
        "invalid_api_key",
        headers={"Authorization": "Bearer ry_000000000000_forged"},
        auth=False,
    ),
]


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    app = make_app(database_url, engine, registry, max_request_bytes=MAX_BYTES)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def test_bad_input__table_has_enough_distinct_cases():
    assert len(CASES) >= 25
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input__answers_its_status_and_code(client: TestClient, engine: Engine, case: Case):
    headers = {**(bearer(engine, "acme") if case.auth else {}), **case.headers}
    kwargs: dict[str, Any] = {"headers": headers}
    if case.json is not None:
        kwargs["json"] = case.json
    elif case.content is not None:
        kwargs["content"] = case.content
    elif case.name.endswith("(chunked)"):
        kwargs["content"] = _chunks()
    response = client.request(case.method, case.path, **kwargs)
    assert response.status_code == case.status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == case.code, body
    assert body["status"] == case.status and body["title"] and body["detail"]
    if case.problem_field is not None:
        assert body["field"] == case.problem_field, body
    assert "Traceback" not in response.text
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0
