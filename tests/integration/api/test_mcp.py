"""The MCP server at /mcp, driven by the official MCP client over streamable HTTP on loopback:
tools listed with their schemas, calls as runs (sync mode, with a fake runner), refusals, one
tenant apart from another, and a call cut mid-way that a retry with its key does not run twice."""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import (
    count,
    live_server,
    make_app,
    run_status,
    wait_until,
)
from worker.service import Worker, WorkerConfig

SYNC = {"queue_enabled": False}
RUN_ID_META = "io.runyard/run_id"
LONG_LOG = "".join(f"line {n}\n" for n in range(1500))  # more than two progress messages
ARTIFACTS = {"report.txt": b"all good\n", "deep/\u00fc #1.bin": bytes(range(256))}


@asynccontextmanager
async def mcp_client(url: str, key: str, **options: Any) -> AsyncIterator[Client]:
    """The SDK's client on ``url``/mcp with ``key`` as its Bearer token."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300)
    )
    async with (
        http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), **options) as client,
    ):
        yield client


class Tools:
    """A fake engine: ``echo`` returns its input, ``shell`` keeps two files, ``result-bytes``
    prints a long log, ``fail`` fails, anything else prints a line, blocks until ``release``
    is set, and prints another."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def __call__(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        name = spec.tool["name"]
        if name == "echo":
            return AttemptResult(RunStatus.SUCCEEDED, 0, result=spec.input)
        if name == "shell":
            assert control.artifacts is not None
            writer = control.artifacts.writer(spec.run_id)
            for path, data in ARTIFACTS.items():
                writer.add(path, iter([data]))
            writer.done()
            return AttemptResult(
                RunStatus.SUCCEEDED, 0, stdout="wrote two files\n", artifact_set=writer.set_id
            )
        if name == "result-bytes":
            assert control.logs is not None
            control.logs.write("stdout", LONG_LOG, "2026-01-01T00:00:00.000000000Z")
            return AttemptResult(RunStatus.SUCCEEDED, 0, result={"words": 1})
        if name == "fail":
            return AttemptResult(
                RunStatus.FAILED,
                3,
                stderr="about to fail\n",
                error_code="tool_failed",
                error="the tool exited with code 3",
            )
        self.started.release()
        assert control.logs is not None
        control.logs.write("stdout", "sleeping\n", "2026-01-01T00:00:00.000000000Z")
        while not self.release.wait(0.02):
            if control.cancel.is_set():
                return AttemptResult(RunStatus.CANCELLED, error_code="cancelled")
        control.logs.write("stdout", "done\n", "2026-01-01T00:00:01.000000000Z")
        return AttemptResult(RunStatus.SUCCEEDED, 0, result={"slept": True})


@pytest.fixture
def tools() -> Iterator[Tools]:
    made = Tools()
    yield made
    made.release.set()


@pytest.fixture
def runner(tools: Tools) -> FakeRunner:
    return FakeRunner(tools)


@pytest.fixture
def sync_api(database_url: str, engine: Engine, registry: ToolRegistry, runner) -> Iterator[str]:
    app = make_app(database_url, engine, registry, runner, max_wait_seconds=10.0, **SYNC)
    with live_server(app) as url:
        yield url


def test_mcp__lists_the_tools_with_their_schemas_and_answers_a_call_with_its_result(
    sync_api: str, engine: Engine, registry: ToolRegistry, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="api.mcp")
    key = create_api_key(engine, "acme")

    async def scenario() -> None:
        async with mcp_client(sync_api, key) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            answer = await client.call_tool("echo", {"hello": "world"})
            run_id = (answer.meta or {})[RUN_ID_META]
            fetched = await client.call_tool("runyard_get_run", {"run_id": run_id})
            resource = await client.read_resource(f"runyard://runs/{run_id}")
        sleep = registry.get("sleep")
        assert sleep is not None
        assert tools["sleep"].input_schema == sleep.input_schema
        assert tools["sleep"].description == sleep.description
        assert tools["echo"].input_schema == {"type": "object"}
        # The tool declares no schema: any object.
        assert tools["fail"].input_schema["type"] == "object"
        assert "runyard_get_run" in tools
        assert answer.is_error is False
        assert answer.structured_content == {"hello": "world"}
        assert answer.content[0].text == '{"hello": "world"}'  # type: ignore[union-attr]
        assert fetched.structured_content == {"hello": "world"}
        assert '"status": "succeeded"' in resource.contents[0].text  # type: ignore[union-attr]
        (logged,) = [r for r in caplog.records if r.getMessage() == "mcp call submitted a run"]
        assert logged.__dict__["run_id"] == run_id and logged.__dict__["replayed"] is False

    anyio.run(scenario)


def test_mcp__a_failed_run_is_a_tool_error_with_its_error_and_id(sync_api: str, engine: Engine):
    key = create_api_key(engine, "acme")

    async def scenario() -> Any:
        async with mcp_client(sync_api, key, mode="legacy") as client:
            return await client.call_tool("fail", {})

    answer = anyio.run(scenario)
    assert answer.is_error is True
    run_id = answer.structured_content["run_id"]
    assert answer.content[0].text == (
        f"run {run_id} failed (tool_failed): the tool exited with code 3"
    )
    assert run_status(engine, run_id) == "failed"


def test_mcp__artifacts_are_resource_links_that_the_caller_alone_can_read(
    sync_api: str, engine: Engine
):
    acme, other = create_api_key(engine, "acme"), create_api_key(engine, "other")

    async def scenario() -> tuple[Any, dict[str, bytes]]:
        async with mcp_client(sync_api, acme) as client:
            answer = await client.call_tool("shell", {"script": "echo"})
            links = [block for block in answer.content if block.type == "resource_link"]
            read = {}
            for link in links:
                (contents,) = (await client.read_resource(link.uri)).contents
                read[link.name] = base64.b64decode(contents.blob)  # type: ignore[union-attr]
        async with mcp_client(sync_api, other) as client:
            with pytest.raises(MCPError, match="no run"):
                await client.read_resource(links[0].uri)
        return answer, read

    answer, read = anyio.run(scenario)
    assert answer.is_error is False
    assert answer.content[0].text == "wrote two files\n"
    assert read == ARTIFACTS


def test_mcp__bad_input_is_an_error_naming_the_field_and_starts_no_run(
    sync_api: str, engine: Engine
):
    key = create_api_key(engine, "acme")

    async def scenario() -> Any:
        async with mcp_client(sync_api, key) as client:
            meta: types.RequestParamsMeta = {"io.runyard/idempotency_key": "two words"}  # type: ignore[typeddict-unknown-key]
            with pytest.raises(MCPError) as bad_key:
                await client.call_tool("echo", {}, meta=meta)
            return await client.call_tool("sleep", {"seconds": "long"}), bad_key

    answer, bad_key = anyio.run(scenario)
    assert "io.runyard/idempotency_key must be 1 to 255 printable ASCII" in str(bad_key.value)
    assert answer.is_error is True
    assert answer.structured_content["code"] == "invalid_input"
    assert answer.structured_content["field"] == "input.seconds"
    assert "input.seconds: 'long' is not of type 'number'" in answer.content[0].text
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0


def test_mcp__refuses_unknown_keys_and_tools_and_keeps_tenants_apart(sync_api: str, engine: Engine):
    acme, other = create_api_key(engine, "acme"), create_api_key(engine, "other")
    unauthenticated = httpx2.post(
        f"{sync_api}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=10
    )
    wrong_key = httpx2.post(
        f"{sync_api}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Authorization": "Bearer ry_nope_nope"},
        timeout=10,
    )

    async def scenario() -> tuple[Any, ...]:
        async with mcp_client(sync_api, acme) as client:
            mine = await client.call_tool("echo", {"secret": 1})
            with pytest.raises(MCPError, match="unknown tool 'nope'"):
                await client.call_tool("nope", {})
            listed = [r.uri for r in (await client.list_resources()).resources]
        run_id = (mine.meta or {})[RUN_ID_META]
        assert listed == [f"runyard://runs/{run_id}"]
        async with mcp_client(sync_api, other) as client:
            assert (await client.list_resources()).resources == []
            theirs = await client.call_tool("runyard_get_run", {"run_id": run_id})
            with pytest.raises(MCPError, match=f"no run {run_id}"):
                await client.read_resource(f"runyard://runs/{run_id}")
        return run_id, theirs

    run_id, theirs = anyio.run(scenario)
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()["code"] == "unauthenticated"
    assert wrong_key.status_code == 401
    assert theirs.is_error is True
    assert theirs.structured_content == {
        "code": "run_not_found",
        "detail": f"no run {run_id}",
    }
    assert count(engine, "SELECT count(*) FROM tool_runs") == 1


def test_mcp__a_key_limited_to_some_tools_lists_only_those_and_is_refused_the_rest(
    sync_api: str, engine: Engine
):
    echo_only = create_api_key(engine, "acme", tools=["echo"])

    async def scenario() -> list[str]:
        async with mcp_client(sync_api, echo_only) as client:
            listed = [tool.name for tool in (await client.list_tools()).tools]
            with pytest.raises(MCPError, match="sleep"):
                await client.call_tool("sleep", {"seconds": 1})
            assert (await client.call_tool("echo", {"n": 1})).is_error is False
        return listed

    listed = anyio.run(scenario)
    assert "echo" in listed and "sleep" not in listed
    assert count(engine, "SELECT count(*) FROM tool_runs") == 1  # the echo, no sleep


def test_mcp__a_call_cut_while_its_run_runs_is_not_run_again_when_retried_with_its_key(
    sync_api: str, engine: Engine, tools: Tools, runner: FakeRunner
):
    key = create_api_key(engine, "acme")
    meta: types.RequestParamsMeta = {"io.runyard/idempotency_key": "agent-call-1"}  # type: ignore[typeddict-unknown-key]

    async def cut_call() -> None:
        async with anyio.create_task_group() as tasks:

            async def call() -> None:
                async with mcp_client(sync_api, key) as client:
                    await client.call_tool("sleep", {"seconds": 5}, meta=meta)

            tasks.start_soon(call)
            await anyio.to_thread.run_sync(tools.started.acquire)
            tasks.cancel_scope.cancel()  # the client goes away mid-call

    async def retry() -> Any:
        async with mcp_client(sync_api, key) as client:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(anyio.to_thread.run_sync, _release_soon, tools)
                    return await client.call_tool("sleep", {"seconds": 5}, meta=meta)

    anyio.run(cut_call)
    (run_id,) = _run_ids(engine)
    assert run_status(engine, run_id) == "running"  # the cut left the run going
    answer = anyio.run(retry)
    assert answer.is_error is False, answer
    assert (answer.meta or {})[RUN_ID_META] == run_id
    assert answer.structured_content == {"slept": True}
    assert _run_ids(engine) == [run_id]
    assert len(runner.started) == 1


def test_mcp__the_run_logs_come_as_progress_to_a_client_that_asks(
    sync_api: str, engine: Engine, tools: Tools
):
    key = create_api_key(engine, "acme")
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")
        tools.release.set()

    async def scenario() -> Any:
        async with mcp_client(sync_api, key) as client:
            with anyio.fail_after(20):
                return await client.call_tool(
                    "sleep", {"seconds": 5}, progress_callback=on_progress
                )

    answer = anyio.run(scenario)
    assert answer.structured_content == {"slept": True}
    # The last line too, written just before the run ended.
    assert "".join(messages) == "sleeping\ndone\n"


def _release_soon(tools: Tools) -> None:
    """Let the blocked tool end a moment after the retry is on its way."""
    tools.release.wait(0.5)
    tools.release.set()


def _run_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [str(row.id) for row in conn.execute(text("SELECT id FROM tool_runs"))]


def _rpc(http: httpx2.Client, body: dict[str, Any], session: str | None = None) -> Any:
    """One JSON-RPC message POSTed to /mcp; the response's message (SSE or JSON), if any."""
    headers = {"Accept": "application/json, text/event-stream"}
    if session is not None:
        headers |= {"Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"}
    response = http.post("/mcp", json=body, headers=headers)
    assert response.status_code < 300, response.text
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return (response, json.loads(data[-1]) if data else None)


@pytest.mark.slow  # sits out the server's longest wait
def test_mcp__queue_mode_a_call_past_the_wait_names_its_run_and_a_resend_on_the_session_replays_it(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, max_wait_seconds=0.2)
    key = create_api_key(engine, "acme")
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
    with (
        live_server(app) as url,
        httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=20) as http,
    ):
        opened, _ = _rpc(
            http,
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            },
        )
        session = opened.headers["mcp-session-id"]
        _rpc(http, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        _, first = _rpc(http, {**call, "id": 5}, session)
        _, resent = _rpc(http, {**call, "id": 5}, session)
        _, another = _rpc(http, {**call, "id": 6}, session)
        # A session answers only the key that opened it.
        stranger = http.post(
            "/mcp",
            json={**call, "id": 7},
            headers={
                "Authorization": f"Bearer {create_api_key(engine, 'acme')}",
                "Accept": "application/json, text/event-stream",
                "Mcp-Session-Id": session,
                "Mcp-Protocol-Version": "2025-11-25",
            },
        )
        paths = http.get("/openapi.json").json()["paths"]
    text = first["result"]["content"][0]["text"]
    run_id = first["result"]["structuredContent"]["run_id"]
    assert first["result"]["structuredContent"]["status"] == "queued"
    assert f"run {run_id} is still queued after waiting" in text
    assert "runyard_get_run" in text and f"runyard://runs/{run_id}" in text
    assert resent["result"]["structuredContent"]["run_id"] == run_id
    assert another["result"]["structuredContent"]["run_id"] != run_id
    assert stranger.status_code == 404
    assert count(engine, "SELECT count(*) FROM tool_runs") == 2
    assert not [path for path in paths if path.startswith("/mcp")]


def test_mcp__queue_mode_a_call_is_answered_when_a_worker_ends_its_run_with_its_logs_on_the_way(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue, tools: Tools
):
    app = make_app(database_url, engine, registry, max_wait_seconds=20.0)
    key = create_api_key(engine, "acme")
    worker = Worker(queue, FakeRunner(tools), WorkerConfig(worker_id="w-mcp", concurrency=1))
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")
        tools.release.set()

    def work_once_queued() -> None:
        wait_until(lambda: count(engine, "SELECT count(*) FROM tool_runs") == 1, timeout=20)
        assert worker.run_once().claimed == 1

    async def scenario(url: str) -> Any:
        async with mcp_client(url, key) as client:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(anyio.to_thread.run_sync, work_once_queued)
                    return await client.call_tool(
                        "sleep", {"seconds": 1}, progress_callback=on_progress
                    )

    try:
        with live_server(app) as url:
            answer = anyio.run(scenario, url)
        assert worker.wait_idle(10)
    finally:
        worker.close()
    assert answer.is_error is False, answer
    assert answer.structured_content == {"slept": True}
    assert "".join(messages) == "sleeping\ndone\n"


def test_mcp__a_long_log_comes_as_progress_in_pieces_of_at_most_4096_characters(
    sync_api: str, engine: Engine
):
    key = create_api_key(engine, "acme")
    received: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, message or ""))

    async def scenario() -> Any:
        async with mcp_client(sync_api, key) as client:
            return await client.call_tool(
                "result-bytes", {"b64": ""}, progress_callback=on_progress
            )

    answer = anyio.run(scenario)
    assert answer.structured_content == {"words": 1}
    assert "".join(message for _, message in received) == LONG_LOG
    assert max(len(message) for _, message in received) == 4096
    assert [progress for progress, _ in received] == sorted({p for p, _ in received})
    assert received[-1][0] == len(LONG_LOG)


def test_mcp__an_sdk_that_fails_to_load_answers_503_while_the_rest_of_the_api_serves(
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    loads: list[int] = []

    def broken_sdk() -> None:
        loads.append(1)
        raise ImportError("no module named 'mcp'")

    monkeypatch.setattr("api.mcp.mount.import_sdk", broken_sdk)
    app = make_app(database_url, engine, registry, queue_enabled=False)
    key = create_api_key(engine, "acme")
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    with (
        caplog.at_level(logging.ERROR, logger="api.mcp.mount"),
        live_server(app) as url,
        httpx2.Client(base_url=url, timeout=20) as http,
    ):
        unauthenticated = http.post("/mcp", json=initialize, headers=accept)
        loads_before_a_key = len(loads)
        first = http.post(
            "/mcp", json=initialize, headers={**accept, "Authorization": f"Bearer {key}"}
        )
        again = http.post(
            "/mcp", json=initialize, headers={**accept, "Authorization": f"Bearer {key}"}
        )
        tools = http.get("/v1/tools", headers={"Authorization": f"Bearer {key}"})
    # An unauthenticated request is refused before anything is loaded for it.
    assert unauthenticated.status_code == 401 and loads_before_a_key == 0
    for answer in (first, again):
        assert answer.status_code == 503
        assert answer.json()["code"] == "mcp_unavailable"
        assert "the MCP SDK or its server failed" in answer.json()["detail"]
    assert loads == [1]  # one attempt to load, not one a request
    assert tools.status_code == 200
    assert "the SDK or its server failed" in caplog.text and "no module named 'mcp'" in caplog.text
