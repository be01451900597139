"""The self-healing LISTEN loop: a lost connection or a callback's own error is told to
``lost`` and the loop listens again; it returns once stopped."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from runyard.platform.listening import listen_until_stopped


@pytest.mark.parametrize(
    "failure",
    [psycopg.OperationalError("connection lost"), RuntimeError("a callback's bug")],
    ids=["connection", "callback"],
)
def test_listen_until_stopped__a_failure_is_told_to_lost_and_it_listens_again(
    failure: Exception, caplog: pytest.LogCaptureFixture
):
    stop = threading.Event()
    calls: list[str] = []

    def listen() -> None:
        calls.append("listen")
        if len(calls) == 1:
            raise failure
        stop.set()  # the second listen runs until stopped

    caplog.set_level(logging.WARNING)
    listen_until_stopped(listen, stop, lambda: calls.append("lost"), "test listen")
    assert calls == ["listen", "lost", "listen"]
    assert "test listen" in caplog.text
