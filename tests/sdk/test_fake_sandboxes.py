"""Sandboxes in the SDK's fake: create, exec (waited and streamed), files, close, in both
flavours, with commands answered by a Python callable."""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest

from runyard_client import ConflictError, NotFoundError
from runyard_client.testing import AsyncFakeRunyard, FakeBackend, FakeExecCall, FakeRunyard


def shell(call: FakeExecCall) -> tuple[int, str, str]:
    """``cat FILE`` prints a file of the sandbox; anything else fails to stderr."""
    if call.command[:1] == ["cat"]:
        return 0, call.files[call.command[1]].decode(), ""
    return 127, "", f"{call.command[0]}: not found\n"


def test_fake_sandbox__execs_streams_and_moves_files():
    backend = FakeBackend({"box": lambda value: value}, sandbox_commands=shell)
    with FakeRunyard(backend=backend) as ry:
        with ry.create_sandbox("box") as box:
            box.upload("src/a.txt", b"hello\n")
            done = box.exec(["cat", "src/a.txt"])
            failed = box.exec(["nope"])
            events = [(e.stream, e.text) for e in box.exec_stream(["cat", "src/a.txt"])]
            tar = box.download("src")
        listed = ry.list_sandboxes()

    assert (done.exit_code, done.stdout) == (0, "hello\n")
    assert (failed.exit_code, failed.stderr) == (127, "nope: not found\n")
    assert events == [("stdout", "hello\n"), ("exit", "")]
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        assert archive.getnames() == ["src/a.txt"]
    assert [(s.id, s.status, s.end_reason) for s in listed] == [(box.id, "ended", "deleted")]


def test_fake_sandbox__async_and_an_unknown_sandbox():
    async def scenario() -> str:
        async with AsyncFakeRunyard({"box": lambda value: value}) as ry:
            async with await ry.create_sandbox("box") as box:
                await box.upload("n.txt", b"1")
                return (await box.exec(["true"])).stdout + (await box.download("n.txt")).decode()

    assert asyncio.run(scenario()) == "1"
    with FakeRunyard({"box": lambda value: value}) as ry, pytest.raises(NotFoundError):
        ry.sandbox("00000000-0000-0000-0000-000000000000")


def test_fake_sandbox__a_create_with_a_used_key_answers_the_first_one_in_both_flavours():
    backend = FakeBackend({"box": lambda value: value})
    with FakeRunyard(backend=backend) as ry:
        first = ry.create_sandbox("box", idempotency_key="k1")
        again = ry.create_sandbox("box", idempotency_key="k1")
        fresh = ry.create_sandbox("box")
        with pytest.raises(ConflictError):
            ry.create_sandbox("box", idempotency_key="k1", max_execs=2)

    async def scenario() -> str:
        async with AsyncFakeRunyard(backend=backend) as ary:
            return str((await ary.create_sandbox("box", idempotency_key="k1")).id)

    assert again.id == first.id != fresh.id
    assert asyncio.run(scenario()) == str(first.id)
