"""The Docker adapter of sandbox terminals: ``docker exec`` with a TTY, attached by socket."""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import requests.exceptions

from runyard.runner import RunnerUnavailable
from runyard.sandbox_engine import (
    TERMINAL_SIGNAL,
    TERMINAL_SIGNALS,
    TERMINAL_WRAPPER,
    SandboxNotRunning,
)

READ_BYTES = 65_536
_TRANSPORT_ERRORS = (
    docker.errors.APIError,
    docker.errors.DockerException,
    requests.exceptions.RequestException,
    OSError,
)


@contextlib.contextmanager
def exec_errors(container: str, what: str) -> Iterator[None]:
    """The engine's answers to an exec as the port's errors: no such or a stopped container
    is ``SandboxNotRunning``, anything else ``RunnerUnavailable``."""
    try:
        yield
    except docker.errors.NotFound as exc:
        raise SandboxNotRunning(f"no container {container}") from exc
    except docker.errors.APIError as exc:
        if exc.status_code == 409:
            raise SandboxNotRunning(f"container {container} is not running") from exc
        raise RunnerUnavailable(f"cannot {what} {container}: {exc}") from exc
    except _TRANSPORT_ERRORS as exc:
        raise RunnerUnavailable(f"cannot {what} {container}: {exc}") from exc


class DockerTerminal:
    """One attached exec with a TTY."""

    def __init__(self, api: docker.APIClient, container: str, exec_id: str, term_id: str) -> None:
        self._api = api
        self._container = container
        self._exec_id = exec_id
        self._term_id = term_id
        self._attached: Any = api.exec_start(exec_id, tty=True, socket=True)
        # docker-py wraps the connection's socket; the raw one reads and writes both ways.
        self._sock: socket.socket = getattr(self._attached, "_sock", self._attached)

    def send(self, data: bytes) -> None:
        """Bytes typed into the TTY."""
        self._sock.sendall(data)

    def receive(self) -> bytes:
        """The TTY's next output; ``b""`` at its end."""
        try:
            return self._sock.recv(READ_BYTES)
        except OSError:
            return b""

    def resize(self, rows: int, cols: int) -> None:
        """The TTY's new size."""
        try:
            self._api.exec_resize(self._exec_id, height=rows, width=cols)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot resize the terminal: {exc}") from exc

    def signal(self, name: str) -> None:
        """Send a signal to the command, by its noted pid."""
        if name not in TERMINAL_SIGNALS:
            raise ValueError(f"unknown signal {name!r}")
        argv = ["/bin/sh", "-c", TERMINAL_SIGNAL, "runyard-signal", self._term_id, name]
        try:
            created = self._api.exec_create(self._container, argv, stdout=False, stderr=False)
            self._api.exec_start(created["Id"], detach=True)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot signal the terminal: {exc}") from exc

    def exit_code(self) -> int | None:
        """The command's exit code once it ended."""
        try:
            found = self._api.exec_inspect(self._exec_id)
        except _TRANSPORT_ERRORS:
            return None
        code = found.get("ExitCode")
        return None if found.get("Running") or code is None else int(code)

    def close(self) -> None:
        """Hang up (the raw socket and docker-py's wrapper of it)."""
        for closing in (self._sock, self._attached):
            with contextlib.suppress(OSError):
                closing.close()


class DockerTerminals:
    """Opens terminals in a sandbox's container."""

    def __init__(self, api: docker.APIClient) -> None:
        self._api = api

    def open_terminal(
        self, container: str, command: list[str], *, cwd: str, rows: int, cols: int
    ) -> DockerTerminal:
        """Start ``command`` with a TTY in ``cwd``, attached, sized."""
        term_id = str(uuid.uuid4())
        argv = ["/bin/sh", "-c", TERMINAL_WRAPPER, "runyard-term", term_id, *command]
        with exec_errors(container, "open a terminal in"):
            created = self._api.exec_create(
                container, argv, stdin=True, tty=True, workdir=cwd, environment={"TERM": "xterm"}
            )
            terminal = DockerTerminal(self._api, container, str(created["Id"]), term_id)
        try:
            terminal.resize(rows, cols)
        except RunnerUnavailable:
            pass  # a size the engine refuses leaves the default 80x24
        return terminal
