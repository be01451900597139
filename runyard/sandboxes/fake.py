"""The sandbox engine without Docker, for tests: each command is a record of what the
wrapper would have written, and the test writes its output and exit."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from runyard.sandbox_engine import ExecFiles, SandboxNotRunning
from runyard.sandbox_session import SessionClient, decode_word
from runyard.sandboxes.store import OpenExec


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
        # Sessions opened (their peers), and whether a new one is refused.
        self.sessions: list[FakeSessionPeer] = []
        self.refuse_sessions = False
        self.stdins: dict[uuid.UUID, bytes] = {}

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

    def open_session(self, container: str, wake: Callable[[], None]) -> SessionClient:
        """A session answered by a ``FakeSessionPeer``."""
        self._check()
        if self.refuse_sessions:
            raise SandboxNotRunning("the fake engine refuses sessions")
        peer = FakeSessionPeer(self)
        peer.client = SessionClient(peer, wake=wake, answer_seconds=0.5)
        self.sessions.append(peer)
        return peer.client

    def put_stdin(self, container: str, exec_id: uuid.UUID, stdin: bytes, user: str) -> None:
        """Kept until the command starts."""
        self._check()
        self.stdins[exec_id] = stdin

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


class FakeSessionPeer:
    """The session's ``sh`` loop in memory: answers each request line from the fake engine's
    commands, framed as ``SESSION`` frames it; a test can make it misbehave."""

    def __init__(self, engine: FakeSandboxEngine) -> None:
        self.engine = engine
        self.client: SessionClient | None = None
        self.requests: list[str] = []
        self.closed = False
        # Bytes written before the next answer (a command posing as the session).
        self.injected = b""
        # A read's answer stops after this many of its bytes and the session dies.
        self.die_after_bytes: int | None = None

    def send(self, data: bytes) -> None:
        """One request line: answered at once (into the client's buffer)."""
        if self.closed:
            raise OSError("the fake session is closed")
        assert self.client is not None
        op, nonce, exec_id, *words = data.decode("ascii").rstrip("\n").split(" ")
        self.requests.append(op)
        found = self.engine.execs.get(uuid.UUID(exec_id))
        if op == "p":
            files = self.engine.poll_exec("", uuid.UUID(exec_id))
            sizes = f"{'-' if files.exit_code is None else files.exit_code} "
            sizes += f"{files.stdout_size} {files.stderr_size}"
            answer = f"{nonce} p {sizes if files.started else 'missing'}\n".encode()
        elif op == "r":
            stream, offset, size = words[0], int(words[1]), int(words[2])
            data = bytes(getattr(found, stream)[offset : offset + size]) if found else b""
            answer = f"{nonce} r {len(data)}\n".encode() + data + f"{nonce} e\n".encode()
            if self.die_after_bytes is not None:
                answer = answer[: answer.index(b"\n") + 1 + self.die_after_bytes]
                self.client.feed_stdout(self.injected + answer)
                self.closed = True
                self.client.feed_end()
                return
        elif op == "s":
            env_count = int(words[0])
            pairs = [decode_word(w).partition("=") for w in words[1 : 1 + env_count]]
            cwd, *command = (decode_word(w) for w in words[1 + env_count :])
            stdin = self.engine.stdins.pop(uuid.UUID(exec_id), None)
            env = {name: value for name, _, value in pairs}
            self.engine.start_exec(
                "", uuid.UUID(exec_id), command, env=env, cwd=cwd, stdin=stdin, user=""
            )
            answer = f"{nonce} s\n".encode()
        else:
            self.engine.kill_exec("", uuid.UUID(exec_id))
            answer = f"{nonce} k\n".encode()
        self.client.feed_stdout(self.injected + answer)
        self.injected = b""

    def close(self) -> None:
        """The owner hung up."""
        self.closed = True


def pending_exec(
    exec_id: uuid.UUID, command: list[str], env: dict[str, str] | None = None, cwd: str = "/"
) -> OpenExec:
    """A command as the owner reads it before it starts."""
    return OpenExec(
        id=exec_id,
        status="pending",
        command=command,
        env=env or {},
        cwd=cwd,
        timeout_seconds=60,
        started_at=None,
        stdout_end=0,
        stderr_end=0,
        timed_out=False,
        has_stdin=False,
    )
