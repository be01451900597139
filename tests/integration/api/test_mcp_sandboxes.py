"""The sandbox tools of the MCP server without a container: not offered in sync mode, and in
queue mode the answers that need no worker (a sandbox still starting, refusals, caps). Their
life on a real worker is in tests/integration/sandboxes/test_sandbox_mcp_docker.py."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from mcp import MCPError, types
from sqlalchemy import Engine, text

from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import live_server, make_app
from tests.integration.api.test_mcp import mcp_client


def test_mcp_sandboxes__sync_mode_neither_lists_nor_answers_the_sandbox_tools(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, queue_enabled=False)
    key = create_api_key(engine, "acme")

    async def scenario(url: str) -> list[str]:
        async with mcp_client(url, key) as client:
            listed = [tool.name for tool in (await client.list_tools()).tools]
            with pytest.raises(MCPError, match="unknown tool 'runyard_sandbox_create'"):
                await client.call_tool("runyard_sandbox_create", {"tool": "sandbox"})
        return listed

    with live_server(app) as url:
        listed = anyio.run(scenario, url)
    assert "echo" in listed
    assert not [name for name in listed if name.startswith("runyard_sandbox_")]


def test_mcp_sandboxes__queue_mode_without_a_worker_answers_starting_and_refuses_bad_calls(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    # A request guard above the file cap: the cap of a write is the tool's own.
    app = make_app(
        database_url, engine, registry, max_wait_seconds=0.3, max_request_bytes=4_194_304
    )
    key = create_api_key(engine, "acme")
    nobody = str(uuid.uuid4())

    async def scenario(url: str) -> dict[str, Any]:
        async with mcp_client(url, key) as client:

            async def call(name: str, **arguments: Any) -> Any:
                return await client.call_tool(f"runyard_sandbox_{name}", arguments)

            return {
                "created": await call("create", tool="sandbox", ttl_seconds=60),
                "not-a-sandbox-tool": await call("create", tool="echo"),
                "unknown-argument": await call("create", tool="sandbox", image="alpine"),
                "ttl-above-maximum": await call("create", tool="sandbox", ttl_seconds=10**6),
                "empty-command": await call("exec", sandbox_id=nobody, command=[]),
                "no-such-sandbox": await call("exec", sandbox_id=nobody, command=["true"]),
                "bad-encoding": await call(
                    "write_file", sandbox_id=nobody, path="a", content="x", encoding="hex"
                ),
                "bad-base64": await call(
                    "write_file", sandbox_id=nobody, path="a", content="%%", encoding="base64"
                ),
                "too-big": await call(
                    "write_file", sandbox_id=nobody, path="a", content="x" * 1_048_577
                ),
            }

    with live_server(app) as url:
        seen = anyio.run(scenario, url)
    created = seen.pop("created")
    assert created.is_error is False
    assert created.structured_content["status"] == "starting"
    assert "runyard_sandbox_exec runs a command once it started" in created.content[0].text
    codes = {name: answer.structured_content["code"] for name, answer in seen.items()}
    assert codes == {
        "not-a-sandbox-tool": "not_a_sandbox_tool",
        "unknown-argument": "invalid_input",
        "ttl-above-maximum": "invalid_input",
        "empty-command": "invalid_input",
        "no-such-sandbox": "sandbox_not_found",
        "bad-encoding": "invalid_input",
        "bad-base64": "invalid_input",
        "too-big": "file_too_large",
    }
    assert all(answer.is_error for answer in seen.values())
    assert seen["unknown-argument"].structured_content["field"] == "image"
    assert seen["empty-command"].structured_content["field"] == "command"
    assert "PUT /v1/sandboxes/" in seen["too-big"].content[0].text


def test_mcp_sandboxes__a_create_retried_with_its_key_answers_the_first_sandbox(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, max_wait_seconds=0.3)
    key = create_api_key(engine, "acme")
    meta: types.RequestParamsMeta = {"io.runyard/idempotency_key": "agent-box-1"}  # type: ignore[typeddict-unknown-key]

    async def scenario(url: str) -> list[Any]:
        answers = []
        for _ in range(2):  # a client that lost the first answer sends the call again
            async with mcp_client(url, key) as client:
                answers.append(
                    await client.call_tool("runyard_sandbox_create", {"tool": "sandbox"}, meta=meta)
                )
        return answers

    with live_server(app) as url:
        first, again = anyio.run(scenario, url)

    assert first.is_error is False and again.is_error is False
    assert again.structured_content["id"] == first.structured_content["id"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sandboxes")).scalar_one() == 1
