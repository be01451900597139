"""A sandbox's terminal over a real WebSocket (uvicorn with ``websockets``): typing, the
TTY's size, Ctrl-C, signals, the exit code, and the refusals."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.integration.api.test_api_helpers import bearer
from tests.integration.sandboxes.conftest import Stack

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def open_terminal(stack: Stack, sid: str, query: str = "") -> ClientConnection:
    url = stack.url.replace("http://", "ws://") + f"/v1/sandboxes/{sid}/terminal{query}"
    key = str(stack.client.headers["Authorization"])
    return connect(url, additional_headers={"Authorization": key}, open_timeout=30)


def read_until(ws: ClientConnection, wanted: bytes, timeout: float = 20) -> bytes:
    """The TTY's output until ``wanted`` shows (or the exit frame as text)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen
        frame = ws.recv(timeout=left)
        seen += frame if isinstance(frame, bytes) else frame.encode()
    return seen


def test_terminal__types_sizes_interrupts_and_exits_with_the_code(stack: Stack):
    sid = stack.create()["id"]
    with open_terminal(stack, sid, "?rows=30&cols=100") as ws:
        ws.send(b"stty size; echo hi-$((1+2))\n")
        assert b"30 100" in read_until(ws, b"hi-3")
        ws.send(json.dumps({"type": "resize", "rows": 40, "cols": 120}))
        ws.send(json.dumps({"type": "stdin", "data": "sleep 30\n"}))
        # Ctrl-C through the TTY once sleep runs (while the shell edits a line it is a key):
        # the foreground sleep dies.
        time.sleep(1.0)
        ws.send(b"\x03")
        ws.send(b'stty size; echo ba""ck\n')  # the TTY echoes the line; only the output says back
        assert b"40 120" in read_until(ws, b"back")
        ws.send(json.dumps({"type": "nonsense"}))
        assert b"type must be" in read_until(ws, b"error")
        ws.send(b"exit 7\n")
        exit_frame = read_until(ws, b'"exit_code"')
    assert b'"exit_code": 7' in exit_frame


def test_terminal__a_signal_ends_it_and_another_tenant_is_refused(stack: Stack):
    sid = stack.create()["id"]
    with open_terminal(stack, sid, "?command=sleep&command=60") as ws:
        time.sleep(0.5)
        ws.send(json.dumps({"type": "signal", "name": "KILL"}))
        assert b'"exit_code": 137' in read_until(ws, b'"exit_code"')

    url = stack.url.replace("http://", "ws://") + f"/v1/sandboxes/{sid}/terminal"
    other = bearer(stack.engine, "other")
    with connect(url, additional_headers=other, open_timeout=30) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404
