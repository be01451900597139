"""The sandbox engine without Docker, for tests: each command is a record of what the
wrapper would have written, and the test writes its output and exit."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from runyard.sandbox_engine import ExecFiles, SandboxNotRunning


@dataclass
class FakeExec:
    """One started command: what it was given and what it wrote."""

    command: list[str]
    env: dict[str, str]
    cwd: str
    stdin: bytes
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None


class FakeSandboxEngine:
    """One container's commands in memory; ``running`` False makes every call refuse."""

    def __init__(self, secrets: list[str] | None = None) -> None:
        self.running = True
        self.execs: dict[uuid.UUID, FakeExec] = {}
        self.start_calls = 0
        self.kills: list[uuid.UUID] = []
        self._secrets = secrets or []

    def _check(self) -> None:
        if not self.running:
            raise SandboxNotRunning("the fake container is not running")

    def ready(self, container: str) -> bool:
        """Ready while it runs."""
        return self.running

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
        """Start it once, as the wrapper's ``mkdir`` does; a second start does nothing."""
        self._check()
        self.start_calls += 1
        self.execs.setdefault(exec_id, FakeExec(command, env, cwd, stdin or b""))

    def poll_exec(self, container: str, exec_id: uuid.UUID) -> ExecFiles:
        """What the wrapper's files say."""
        self._check()
        found = self.execs.get(exec_id)
        if found is None:
            return ExecFiles(started=False)
        return ExecFiles(True, found.exit_code, len(found.stdout), len(found.stderr))

    def read_exec(
        self, container: str, exec_id: uuid.UUID, stream: str, offset: int, size: int
    ) -> bytes:
        """Bytes of one stream's file."""
        self._check()
        data = getattr(self.execs[exec_id], stream)
        return bytes(data[offset : offset + size])

    def kill_exec(self, container: str, exec_id: uuid.UUID) -> None:
        """The command dies of SIGKILL."""
        self._check()
        self.kills.append(exec_id)
        self.execs[exec_id].exit_code = 137

    def secret_values(self, container: str, names: list[str]) -> list[str]:
        """The secrets it was made with."""
        return list(self._secrets)
