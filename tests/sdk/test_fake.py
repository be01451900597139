"""What only the fake has: Python callables as tools, the instant worker and its switch."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runyard_client import RunStatus
from runyard_client.testing import AsyncFakeRunyard, FakeBackend, FakeRunyard, ToolContext


def thumbnail(input: dict[str, str], context: ToolContext) -> dict[str, int]:
    context.print("resizing", input["url"])
    context.artifact("thumb.png", b"\x89PNG...")
    return {"width": 64}


def test_fake__the_readme_example_runs(tmp_path: Path):
    with FakeRunyard({"thumbnail": thumbnail}) as client:
        run = client.run("thumbnail", {"url": "a.png"})
        assert run.result == {"width": 64}
        assert list(client.logs(run.id)) == ["resizing a.png"]
        client.download(run.id, "thumb.png", tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes() == b"\x89PNG..."


def test_fake__the_async_flavour_runs_the_same_tools():
    async def scenario() -> tuple[RunStatus, object]:
        async with AsyncFakeRunyard({"double": lambda value: value * 2}) as client:
            run = await client.run("double", 21)
            return run.status, run.result

    assert asyncio.run(scenario()) == (RunStatus.SUCCEEDED, 42)


def test_fake__without_auto_run_runs_wait_for_run_pending():
    backend = FakeBackend(auto_run=False)
    with FakeRunyard({"echo": lambda value: value}, backend=backend) as client:
        run = client.submit("echo", {"a": 1})
        assert client.get(run.id).status is RunStatus.QUEUED
        assert client.backend.run_pending() == 1
        assert client.get(run.id).result == {"a": 1}


def test_fake__a_dependent_of_a_failed_run_fails_with_dependency_failed():
    def fail(value: object) -> object:
        raise ValueError("no")

    with FakeRunyard({"fail": fail, "echo": lambda value: value}) as client:
        first = client.submit("fail", {})
        second = client.submit("echo", {}, depends_on=[first.id])
        assert client.wait(second.id, timeout=5).error_code == "dependency_failed"
        assert client.get(first.id).error == "no"
