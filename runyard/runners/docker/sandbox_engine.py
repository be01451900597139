"""The Docker adapter of the sandbox engine port: ``docker exec`` of the port's scripts."""

from __future__ import annotations

import io
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import docker
import docker.errors
import requests.exceptions

from runyard.domain.sandboxes import EXECS_DIR
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.connection import skip_environment_lookups
from runyard.runners.docker.engine_marker import EngineMarker
from runyard.runners.docker.outputs import tool_ids
from runyard.runners.docker.sandbox_session import open_docker_session
from runyard.runners.docker.terminal import DockerTerminal, DockerTerminals, exec_errors
from runyard.sandbox_engine import (
    EXEC_KILL,
    EXEC_NO_LINKS,
    EXEC_POLL,
    EXEC_READ,
    EXEC_WRAPPER,
    ExecFiles,
    SandboxNotRunning,
    parse_poll,
)
from runyard.sandbox_session import SessionClient

_TRANSPORT_ERRORS = (
    docker.errors.APIError,
    docker.errors.DockerException,
    requests.exceptions.RequestException,
)


class DockerSandboxEngine:
    """Runs the sandbox scripts in a container through the engine's exec API."""

    def __init__(self, client: docker.DockerClient) -> None:
        self._api = client.api
        self._marker = EngineMarker(client)

    @classmethod
    def from_env(cls, timeout_seconds: float) -> DockerSandboxEngine:
        """Connect the standard way (``DOCKER_HOST`` or the local socket)."""
        try:
            client = docker.from_env(timeout=int(timeout_seconds))
        except docker.errors.DockerException as exc:
            raise RunnerUnavailable(f"cannot reach the Docker engine: {exc}") from exc
        skip_environment_lookups(client.api)
        return cls(client)

    def _exec(
        self,
        container: str,
        argv: list[str],
        *,
        detach: bool = False,
        env: dict[str, str] | None = None,
        user: str = "",
    ) -> bytes:
        """Run ``argv`` in the container: its stdout (or nothing, detached)."""
        with exec_errors(container, "exec in"):
            created = self._api.exec_create(
                container, argv, stdout=True, stderr=False, environment=env, user=user
            )
            output: Any = self._api.exec_start(created["Id"], detach=detach)
        return b"" if detach else bytes(output or b"")

    def start_exec(
        self,
        container: str,
        exec_id: uuid.UUID,
        command: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bytes | None,
        user: str,
    ) -> None:
        """Put the command's stdin in its place, then start it detached under the wrapper."""
        if stdin:
            self.put_stdin(container, exec_id, stdin, user)
        argv = ["/bin/sh", "-c", EXEC_WRAPPER, "runyard-exec", str(exec_id), cwd, *command]
        self._exec(container, argv, detach=True, env=env)

    def put_stdin(self, container: str, exec_id: uuid.UUID, stdin: bytes, user: str) -> None:
        """The stdin as a file of the tool's user, through the engine's archive API."""
        uid, gid = tool_ids(user)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(f"{exec_id}.stdin")
            info.size, info.mode, info.uid, info.gid = len(stdin), 0o600, uid, gid
            info.mtime = time.time()
            tar.addfile(info, io.BytesIO(stdin))
        try:
            self._api.put_archive(container, EXECS_DIR, buffer.getvalue())
        except docker.errors.NotFound as exc:
            raise SandboxNotRunning(f"{container} has no {EXECS_DIR} yet") from exc
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot write stdin into {container}: {exc}") from exc

    def ready(self, container: str) -> bool:
        """The keeper's directories are there: a stat through the engine's archive API,
        which starts no process in the container."""
        url = self._api._url("/containers/{0}/archive", container)
        try:
            answer = self._api.head(url, params={"path": EXECS_DIR})
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot look into {container}: {exc}") from exc
        if answer.status_code == 404:
            return False
        if answer.status_code == 409:
            raise SandboxNotRunning(f"container {container} is not running")
        if answer.status_code >= 400:
            raise RunnerUnavailable(f"cannot look into {container}: {answer.status_code}")
        return True

    def open_session(self, container: str, wake: Callable[[], None]) -> SessionClient:
        """An attached session in the container (``runyard.runners.docker.sandbox_session``)."""
        return open_docker_session(self._api, container, wake)

    def poll_exec(self, container: str, exec_id: uuid.UUID) -> ExecFiles:
        """The command's exit and output sizes, as the container has them."""
        out = self._exec(container, ["/bin/sh", "-c", EXEC_POLL, "runyard-poll", str(exec_id)])
        return parse_poll(out.decode("ascii", "replace"))

    def read_exec(
        self, container: str, exec_id: uuid.UUID, stream: str, offset: int, size: int
    ) -> bytes:
        """Bytes of one output file, read inside the container (no host path is trusted)."""
        argv = ["/bin/sh", "-c", EXEC_READ, "runyard-read", str(exec_id), stream]
        return self._exec(container, [*argv, str(offset), str(size)])[:size]

    def kill_exec(self, container: str, exec_id: uuid.UUID) -> None:
        """SIGKILL the command's process."""
        self._exec(container, ["/bin/sh", "-c", EXEC_KILL, "runyard-kill", str(exec_id)])

    def secret_values(self, container: str, names: list[str]) -> list[str]:
        """The container's values of ``names``, from its configuration."""
        if not names:
            return []
        try:
            attrs = self._api.inspect_container(container)
        except docker.errors.NotFound as exc:
            raise SandboxNotRunning(f"no container {container}") from exc
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot inspect {container}: {exc}") from exc
        wanted = set(names)
        pairs = (entry.partition("=") for entry in attrs.get("Config", {}).get("Env") or [])
        return [value for name, _, value in pairs if name in wanted]

    # --- files ---

    def engine_id(self) -> str:
        """The id kept in the engine's marker."""
        return self._marker.engine_id()

    def has_link(self, container: str, path: str) -> bool:
        """Asked inside the container, as its user: is a component of ``path`` a link?"""
        argv = ["/bin/sh", "-c", EXEC_NO_LINKS, "runyard-check", path]
        for _ in range(2):  # an answer lost on a busy engine is asked again, once
            answer = self._exec(container, argv).strip()
            if answer in (b"ok", b"link"):
                return answer == b"link"
        raise RunnerUnavailable(f"could not check {path!r} in {container}: {answer[:80]!r}")

    def put_archive(self, container: str, directory: str, data: Iterator[bytes]) -> None:
        """Unpack the tar stream into ``directory`` (sent chunked, never held whole)."""
        try:
            self._api.put_archive(container, directory, data)
        except docker.errors.NotFound as exc:
            raise SandboxNotRunning(f"no {directory} in {container}") from exc
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot write into {container}: {exc}") from exc

    def get_archive(self, container: str, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        """``path`` as a tar stream and its stat; FileNotFoundError if it is not there."""
        try:
            stream, stat = self._api.get_archive(container, path, chunk_size=1_048_576)
        except docker.errors.NotFound as exc:
            raise FileNotFoundError(path) from exc
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read from {container}: {exc}") from exc
        return iter(stream), dict(stat)

    # --- terminals ---

    def open_terminal(
        self, container: str, command: list[str], *, cwd: str, rows: int, cols: int
    ) -> DockerTerminal:
        """A command with a TTY in the container (``runyard.runners.docker.terminal``)."""
        return DockerTerminals(self._api).open_terminal(
            container, command, cwd=cwd, rows=rows, cols=cols
        )
