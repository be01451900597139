"""The disconnect watch around waits and inline runs, without a server."""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest
from fastapi import Request

from api.routes.runs import _watching_disconnect


class FakeRequest:
    def __init__(self, disconnect_after: float | None) -> None:
        self._after = disconnect_after

    async def receive(self) -> dict[str, Any]:
        if self._after is None:
            await anyio.sleep_forever()
        await anyio.sleep(self._after or 0)
        return {"type": "http.disconnect"}


def test_watching_disconnect__an_error_of_the_work_comes_out_unwrapped():
    async def work() -> None:
        raise LookupError("boom")

    async def main() -> None:
        await _watching_disconnect(cast(Request, FakeRequest(None)), lambda: None, work)

    with pytest.raises(LookupError):
        anyio.run(main)


def test_watching_disconnect__reports_a_client_that_leaves_and_returns_the_result():
    gone: list[bool] = []

    async def work() -> str:
        with anyio.fail_after(5):
            while not gone:
                await anyio.sleep(0.01)
        return "done"

    async def main() -> str:
        request = cast(Request, FakeRequest(0.05))
        return await _watching_disconnect(request, lambda: gone.append(True), work)

    assert anyio.run(main) == "done"
    assert gone == [True]
