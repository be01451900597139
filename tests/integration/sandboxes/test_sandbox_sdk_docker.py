"""The SDK's sandboxes against the API and a worker on the real engine, in both flavours."""

from __future__ import annotations

import asyncio

import pytest

from runyard_client import AsyncRunyard, Runyard
from tests.integration.sandboxes.conftest import Stack

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def key_of(stack: Stack) -> str:
    return str(stack.client.headers["Authorization"]).removeprefix("Bearer ")


def test_sandbox__sync_client_execs_streams_and_moves_files(stack: Stack):
    with Runyard(stack.url, api_key=key_of(stack)) as ry:
        with ry.create_sandbox("sandbox", ttl_seconds=300) as box:
            assert box.info.status == "running"
            box.upload("in/data.bin", b"\x00\x01binary")
            done = box.exec(["sh", "-c", "wc -c < in/data.bin; cat"], stdin=b"\xffraw")
            events = list(box.exec_stream(["sh", "-c", "echo out; echo err >&2"]))
            fetched = box.download("in/data.bin")
            listed = [s.id for s in ry.list_sandboxes()]
        ended = ry.sandbox(box.id).info

    assert done.exit_code == 0 and done.stdout.startswith("8\n")
    assert {(e.stream, e.text) for e in events[:-1]} == {("stdout", "out\n"), ("stderr", "err\n")}
    assert events[-1].stream == "exit" and events[-1].exit_code == 0
    assert fetched == b"\x00\x01binary"
    assert listed == [box.id]
    assert ended.end_reason in (None, "deleted")  # the owner stops it at its next renewal


def test_sandbox__async_client_execs_and_moves_files(stack: Stack):
    async def scenario() -> tuple[str, bytes, list[str]]:
        async with AsyncRunyard(stack.url, api_key=key_of(stack)) as ry:
            async with await ry.create_sandbox("sandbox") as box:
                await box.upload("note.txt", b"async\n")
                done = await box.exec(["cat", "note.txt"])
                kinds: list[str] = [e.stream async for e in box.exec_stream(["echo", "hi"])]
                return done.stdout, await box.download("note.txt"), kinds

    stdout, fetched, kinds = asyncio.run(scenario())

    assert stdout == "async\n" and fetched == b"async\n"
    assert kinds == ["stdout", "exit"]
