"""The disconnect watch around waits and inline runs, without a server."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import anyio
import pytest
from fastapi import Request

from api.actions.runs import submit_problem, watching_disconnect
from runyard.platform.settings import Settings
from runyard.queue import AdmissionRefused, IdempotencyConflict
from runyard.submission.request import InvalidInput, UnknownTool


class FakeRequest:
    def __init__(self, disconnect_after: float | None) -> None:
        self._after = disconnect_after

    async def receive(self) -> dict[str, Any]:
        if self._after is None:
            await anyio.sleep_forever()
        await anyio.sleep(self._after or 0)
        return {"type": "http.disconnect"}


def testwatching_disconnect__an_error_of_the_work_comes_out_unwrapped():
    async def work() -> None:
        raise LookupError("boom")

    async def main() -> None:
        await watching_disconnect(cast(Request, FakeRequest(None)), lambda: None, work)

    with pytest.raises(LookupError):
        anyio.run(main)


def testwatching_disconnect__reports_a_client_that_leaves_and_returns_the_result():
    gone: list[bool] = []

    async def work() -> str:
        with anyio.fail_after(5):
            while not gone:
                await anyio.sleep(0.01)
        return "done"

    async def main() -> str:
        request = cast(Request, FakeRequest(0.05))
        return await watching_disconnect(request, lambda: gone.append(True), work)

    assert anyio.run(main) == "done"
    assert gone == [True]


class BrokenRequest:
    async def receive(self) -> dict[str, Any]:
        raise RuntimeError("the connection's state is gone")


def testwatching_disconnect__a_watch_that_fails_is_logged_and_the_work_goes_on(
    caplog: pytest.LogCaptureFixture,
):
    async def work() -> str:
        await anyio.sleep(0.05)
        return "done"

    async def main() -> str:
        return await watching_disconnect(cast(Request, BrokenRequest()), lambda: None, work)

    assert anyio.run(main) == "done"
    [record] = [r for r in caplog.records if r.message == "watching the client failed"]
    assert record.exc_info is not None and "state is gone" in str(record.exc_info[1])


def testwatching_disconnect__leaves_no_watch_behind_once_the_work_ends():
    async def work() -> str:
        return "done"

    async def main() -> tuple[str, int]:
        result = await watching_disconnect(cast(Request, FakeRequest(None)), lambda: None, work)
        await asyncio.sleep(0)  # the watch's cancellation is delivered at its next step
        return result, len(asyncio.all_tasks())

    assert anyio.run(main) == ("done", 1)  # only main's own task


class FakeServices:
    settings = Settings(database_url="unused", retry_after_seconds=7)


@pytest.mark.parametrize(
    ("refusal", "status", "code", "retry_after"),
    [
        (UnknownTool("no"), 422, "unknown_tool", None),
        (InvalidInput("bad", "input.n"), 422, "invalid_input", None),
        (IdempotencyConflict("other body"), 409, "idempotency_conflict", None),
        (AdmissionRefused("queue_full", 10), 503, "queue_full", "7"),
        (AdmissionRefused("tenant_queued", 10), 429, "tenant_queued_limit", "7"),
        (AdmissionRefused("tenant_running", 10), 429, "tenant_running_limit", "7"),
        (AdmissionRefused("sync_capacity_full", 4), 429, "sync_capacity_full", "7"),
    ],
)
def test_submit_problem__one_problem_per_refusal(
    refusal: Exception, status: int, code: str, retry_after: str | None
):
    problem = submit_problem(cast(Any, FakeServices()), refusal)
    assert problem is not None
    assert (problem.status, problem.code) == (status, code)
    assert problem.headers.get("Retry-After") == retry_after


def test_submit_problem__anything_else_is_not_a_refusal():
    assert submit_problem(cast(Any, FakeServices()), LookupError("boom")) is None
