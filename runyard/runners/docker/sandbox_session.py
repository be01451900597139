"""The Docker transport of exec sessions: an attached ``docker exec`` of ``SESSION``, its
stdin written to the hijacked socket, its multiplexed stdout and stderr read on a thread."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import docker

from runyard.runners.docker.terminal import exec_errors
from runyard.sandbox_engine import EXEC_WRAPPER
from runyard.sandbox_session import SESSION, SessionClient

logger = logging.getLogger(__name__)

RECV_BYTES = 65_536
# How long one write to the session may block before the session counts as stuck.
SEND_SECONDS = 10.0
_HEADER = 8
_STDOUT, _STDERR = 1, 2


class FrameSplitter:
    """The engine's multiplexed stream (8-byte headers: stream, 0, 0, 0, size) cut back into
    stdout and stderr bytes; a header is the engine's, never the session's."""

    def __init__(self, stdout: Callable[[bytes], None], stderr: Callable[[bytes], None]) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._pending = bytearray()
        self._left = 0
        self._stream = 0

    def feed(self, data: bytes) -> None:
        """Bytes as they came off the socket."""
        self._pending += data
        while self._pending:
            if self._left == 0:
                if len(self._pending) < _HEADER:
                    return
                self._stream = self._pending[0]
                self._left = int.from_bytes(self._pending[4:_HEADER], "big")
                del self._pending[:_HEADER]
                continue
            piece = bytes(self._pending[: self._left])
            del self._pending[: len(piece)]
            self._left -= len(piece)
            if self._stream == _STDOUT:
                self._stdout(piece)
            elif self._stream == _STDERR:
                self._stderr(piece)


class DockerSessionTransport:
    """The hijacked socket of one attached exec."""

    def __init__(self, attached: Any) -> None:
        self._attached = attached
        # docker-py wraps the connection's socket; the raw one reads and writes both ways.
        self._sock: socket.socket = getattr(attached, "_sock", attached)
        self._sock.settimeout(SEND_SECONDS)
        self._closed = threading.Event()

    def send(self, data: bytes) -> None:
        """Write a request to the session's stdin."""
        self._sock.sendall(data)

    def close(self) -> None:
        """Hang up (the session reads the end of its stdin and stops)."""
        self._closed.set()
        for closing in (self._sock, self._attached):
            with contextlib.suppress(OSError):
                closing.close()

    def pump(self, client: SessionClient) -> None:
        """Feed the session's output to ``client`` until the stream ends or is closed."""
        splitter = FrameSplitter(client.feed_stdout, client.feed_stderr)
        try:
            while not self._closed.is_set():
                try:
                    data = self._sock.recv(RECV_BYTES)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                splitter.feed(data)
        finally:
            client.feed_end()


def open_docker_session(
    api: docker.APIClient, container: str, wake: Callable[[], None]
) -> SessionClient:
    """Start ``SESSION`` attached in ``container`` and follow its output on a thread."""
    argv = ["/bin/sh", "-c", SESSION, "runyard-session", EXEC_WRAPPER]
    with exec_errors(container, "open a session in"):
        created = api.exec_create(container, argv, stdin=True, stdout=True, stderr=True)
        attached = api.exec_start(created["Id"], socket=True)
    transport = DockerSessionTransport(attached)
    client = SessionClient(transport, wake=wake)
    threading.Thread(
        target=transport.pump, args=(client,), name=f"session-{container}", daemon=True
    ).start()
    return client
