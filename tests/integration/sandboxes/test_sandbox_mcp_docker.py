"""Sandboxes over MCP, driven by the official MCP client on loopback against the API and a
sandbox worker on the real engine: a sandbox's whole life, tenants kept apart, path rules
and caps, and keys limited to other tools."""

from __future__ import annotations

import base64
from typing import Any

import anyio
import pytest

from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_mcp import mcp_client
from tests.integration.sandboxes.conftest import Stack

pytestmark = pytest.mark.docker

SANDBOX_TOOLS = {
    "runyard_sandbox_create",
    "runyard_sandbox_exec",
    "runyard_sandbox_get_exec",
    "runyard_sandbox_read_file",
    "runyard_sandbox_write_file",
    "runyard_sandbox_close",
}


def _code(answer: Any) -> tuple[bool, str]:
    return answer.is_error, answer.structured_content["code"]


@pytest.mark.slow
def test_mcp_sandbox__create_exec_write_read_and_close_on_a_real_worker(stack: Stack):
    key = create_api_key(stack.engine, "acme")
    blob = bytes(range(256))

    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async def scenario() -> dict[str, Any]:
        async with mcp_client(stack.url, key) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            created = await client.call_tool("runyard_sandbox_create", {"tool": "sandbox"})
            sid = created.structured_content["id"]
            box = {"sandbox_id": sid}
            return {
                "tools": tools,
                "created": created,
                "echo": await client.call_tool(
                    "runyard_sandbox_exec", {**box, "command": ["sh", "-c", "echo hi"]}
                ),
                "streamed": await client.call_tool(
                    "runyard_sandbox_exec",
                    {**box, "command": ["sh", "-c", "echo one; sleep 0.5; echo two >&2"]},
                    progress_callback=on_progress,
                ),
                "failing": await client.call_tool(
                    "runyard_sandbox_exec",
                    {**box, "command": ["sh", "-c", "echo oops >&2; exit 3"]},
                ),
                "write": await client.call_tool(
                    "runyard_sandbox_write_file",
                    {**box, "path": "notes/hello.txt", "content": "hello\n"},
                ),
                "write_blob": await client.call_tool(
                    "runyard_sandbox_write_file",
                    {
                        **box,
                        "path": "blob.bin",
                        "content": base64.b64encode(blob).decode(),
                        "encoding": "base64",
                    },
                ),
                "count": await client.call_tool(
                    "runyard_sandbox_exec",
                    {**box, "command": ["wc", "-c", "hello.txt"], "cwd": "notes"},
                ),
                "read": await client.call_tool(
                    "runyard_sandbox_read_file", {**box, "path": "notes/hello.txt"}
                ),
                "read_blob": await client.call_tool(
                    "runyard_sandbox_read_file", {**box, "path": "blob.bin"}
                ),
                "closed": await client.call_tool("runyard_sandbox_close", box),
                "after": await client.call_tool(
                    "runyard_sandbox_exec", {**box, "command": ["true"]}
                ),
            }

    seen = anyio.run(scenario)
    sid = seen["created"].structured_content["id"]
    assert SANDBOX_TOOLS <= set(seen["tools"])
    create_schema = seen["tools"]["runyard_sandbox_create"].input_schema
    assert create_schema["properties"]["tool"]["enum"] == ["sandbox"]
    assert seen["created"].is_error is False
    assert seen["created"].structured_content["status"] == "running"
    echo = seen["echo"]
    assert echo.is_error is False
    assert echo.structured_content["exit_code"] == 0
    assert echo.structured_content["stdout"] == "hi\n"
    assert echo.content[0].text.startswith("exit code 0\n")
    assert seen["streamed"].structured_content["stderr"] == "two\n"
    assert "".join(messages) == "one\ntwo\n"  # the output as it came, before the answer
    failing = seen["failing"].structured_content
    assert seen["failing"].is_error is True
    assert (failing["exit_code"], failing["stderr"]) == (3, "oops\n")
    assert seen["write"].structured_content == {"path": "notes/hello.txt", "size": 6}
    assert seen["write_blob"].structured_content == {"path": "blob.bin", "size": 256}
    assert seen["count"].structured_content["stdout"] == "6 hello.txt\n"
    read = seen["read"].structured_content
    assert (read["encoding"], read["content"], read["size"]) == ("text", "hello\n", 6)
    read_blob = seen["read_blob"].structured_content
    assert read_blob["encoding"] == "base64"
    assert base64.b64decode(read_blob["content"]) == blob
    closed = seen["closed"].structured_content
    assert (closed["status"], closed["end_reason"]) == ("ended", "deleted")
    assert _code(seen["after"]) == (True, "sandbox_ended")
    assert stack.wait_status(sid, "ended")["end_reason"] == "deleted"


@pytest.mark.slow  # a sandbox held for seconds
def test_mcp_sandbox__another_tenant_gets_not_found_and_bad_paths_and_big_reads_are_refused(
    stack: Stack,
):
    sid = stack.create()["id"]
    made = stack.run(
        sid, ["sh", "-c", "ln -s /etc out && mkdir d && head -c 1048577 /dev/zero > big; echo mine"]
    )
    acme, other = create_api_key(stack.engine, "acme"), create_api_key(stack.engine, "other")
    box = {"sandbox_id": sid}

    leaked: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        leaked.append(message or "")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with mcp_client(stack.url, other) as client:
            theirs = {
                "get_exec": await client.call_tool(
                    "runyard_sandbox_get_exec",
                    {**box, "exec_id": made["id"]},
                    progress_callback=on_progress,
                ),
                "exec": await client.call_tool(
                    "runyard_sandbox_exec", {**box, "command": ["true"]}
                ),
                "read": await client.call_tool("runyard_sandbox_read_file", {**box, "path": "big"}),
                "write": await client.call_tool(
                    "runyard_sandbox_write_file", {**box, "path": "x", "content": "x"}
                ),
                "close": await client.call_tool("runyard_sandbox_close", box),
            }
        async with mcp_client(stack.url, acme) as client:

            async def write(path: str, content: str = "x") -> Any:
                arguments = {**box, "path": path, "content": content}
                return await client.call_tool("runyard_sandbox_write_file", arguments)

            async def read(path: str) -> Any:
                return await client.call_tool("runyard_sandbox_read_file", {**box, "path": path})

            mine = {
                "up-dots": await write("d/../../escape"),
                "absolute": await write("/etc/passwd"),
                "up-through-link": await write("out/evil"),
                "down-dots": await read("../../etc/passwd"),
                "down-through-link": await read("out/passwd"),
                "directory": await read("d"),
                "too-big-read": await read("big"),
                "missing": await read("nothing-here"),
                "bad-id": await client.call_tool("runyard_sandbox_close", {"sandbox_id": "7"}),
                "extra": await client.call_tool("runyard_sandbox_close", {**box, "force": True}),
            }
        return theirs, mine

    theirs, mine = anyio.run(scenario)
    assert {name: _code(answer) for name, answer in theirs.items()} == {
        "get_exec": (True, "exec_not_found"),
        "exec": (True, "sandbox_not_found"),
        "read": (True, "sandbox_not_found"),
        "write": (True, "sandbox_not_found"),
        "close": (True, "sandbox_not_found"),
    }
    assert leaked == []
    assert {name: _code(answer) for name, answer in mine.items()} == {
        "up-dots": (True, "invalid_path"),
        "absolute": (True, "invalid_path"),
        "up-through-link": (True, "link_in_path"),
        "down-dots": (True, "invalid_path"),
        "down-through-link": (True, "link_in_path"),
        "directory": (True, "is_a_directory"),
        "too-big-read": (True, "file_too_large"),
        "missing": (True, "file_not_found"),
        "bad-id": (True, "invalid_input"),
        "extra": (True, "invalid_input"),
    }
    assert f"GET /v1/sandboxes/{sid}/files/big" in mine["too-big-read"].content[0].text
    assert mine["extra"].structured_content["field"] == "force"
    assert stack.wait_status(sid, "running")["status"] == "running"  # nobody closed it


def test_mcp_sandbox__a_key_limited_to_other_tools_sees_no_sandbox_tools_and_cannot_create(
    stack: Stack,
):
    echo_only = create_api_key(stack.engine, "acme", tools=["echo"])

    async def scenario() -> tuple[set[str], Any]:
        async with mcp_client(stack.url, echo_only) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            refused = await client.call_tool("runyard_sandbox_create", {"tool": "sandbox"})
        return listed, refused

    listed, refused = anyio.run(scenario)
    assert not listed & SANDBOX_TOOLS and "echo" in listed
    assert refused.is_error is True
    assert refused.structured_content["code"] == "tool_not_allowed"
    assert stack.client.get("/v1/sandboxes").json()["sandboxes"] == []
