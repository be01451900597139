"""``QuietServer``: uvicorn's server with a slow tick that still stops at once when asked."""

from __future__ import annotations

import signal
import threading
from typing import Any

import httpx
import pytest
import uvicorn
from sse_starlette.sse import AppStatus

from api.serving import QuietServer
from tests.integration.api.test_api_helpers import served_in_thread, wait_until

# Long enough that a stop which waited for the next tick would fail the join below.
AN_HOUR = 3600.0


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest ASGI app: 200 and a word."""
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def quiet_server(tick_seconds: float) -> QuietServer:
    """A server of ``hello`` on a free loopback port."""
    config = uvicorn.Config(
        hello, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="off"
    )
    return QuietServer(config, tick_seconds=tick_seconds)


def test_quiet_server__serves_with_a_date_header_and_stops_when_told_without_its_tick():
    server = quiet_server(AN_HOUR)
    with served_in_thread(server) as (url, thread):
        answer = httpx.get(url)
        assert (answer.status_code, answer.text) == (200, "hello")
        assert answer.headers["date"].endswith(" GMT")
        server.should_exit = True
        thread.join(timeout=20)
        assert not thread.is_alive()


def test_quiet_server__a_signal_stops_it_without_its_tick(monkeypatch: pytest.MonkeyPatch):
    # The MCP SDK's SSE library wraps uvicorn's handle_exit to set a process-wide flag that
    # ends every SSE response of the process from then on. This process serves on after the
    # test (later tests' MCP sessions would end unanswered), so the flag is put back.
    monkeypatch.setattr(AppStatus, "should_exit", AppStatus.should_exit)
    server = quiet_server(AN_HOUR)
    with served_in_thread(server) as (_, thread):
        # What uvicorn's signal handler calls; here from a thread that is not the loop's.
        threading.Thread(target=server.handle_exit, args=(signal.SIGTERM, None)).start()
        thread.join(timeout=20)
        assert not thread.is_alive()


def test_quiet_server__every_tick_refreshes_the_date_header():
    server = quiet_server(0.01)
    counters: list[int] = []
    tick = server.on_tick

    async def counted(counter: int) -> bool:
        counters.append(counter)
        return await tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    with served_in_thread(server):
        wait_until(lambda: len(counters) >= 5, timeout=20)
    # uvicorn refreshes the header on the ticks whose counter is a multiple of ten.
    assert counters[:5] == [0, 10, 20, 30, 40]


def test_quiet_server__told_to_stop_before_it_runs_it_returns():
    server = quiet_server(AN_HOUR)
    server.should_exit = True
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive() and server.should_exit
