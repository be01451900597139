"""How an owner reaches its sandbox's commands: through one open exec session when it has
one, else one engine call each.

A session that breaks (no answer, a garbled one, its stream gone) is closed and the call it
was making is made the per-call way at once; a new session is opened on a later round. Every
call is safe to repeat (a command's ``mkdir`` is its start, bytes are stored by offset), so a
call that a broken session may or may not have carried out is simply made again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from runyard.runner import RunnerUnavailable
from runyard.sandbox_engine import ExecFiles, SandboxEngine, SandboxNotRunning
from runyard.sandbox_session import ExecSession, SessionBroken
from runyard.sandboxes.store import OpenExec

logger = logging.getLogger(__name__)

# After a session could not be opened, or broke, the next try waits this long.
REOPEN_SECONDS = 2.0


class ExecChannel:
    """One sandbox's commands, over a session when there is one."""

    def __init__(
        self,
        engine: SandboxEngine,
        container: str,
        *,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._container = container
        self._wake = wake
        self._clock = clock
        self._lock = threading.Lock()
        self._session: ExecSession | None = None
        self._next_open = 0.0
        self.opened = 0
        self.broken = 0

    @property
    def open(self) -> bool:
        """Whether calls go through a session now."""
        return self._session is not None

    def ensure_open(self) -> None:
        """Open a session if there is none (and the last try is long enough ago)."""
        with self._lock:
            if self._session is not None or self._clock() < self._next_open:
                return
            self._next_open = self._clock() + REOPEN_SECONDS
        try:
            session = self._engine.open_session(self._container, self._wake)
        except (SandboxNotRunning, RunnerUnavailable) as exc:
            logger.info("no exec session", extra={"container": self._container, "error": str(exc)})
            return
        with self._lock:
            self._session, self.opened = session, self.opened + 1

    def close(self) -> None:
        """Close the session, if any (the commands it started run on)."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    def _current(self) -> ExecSession | None:
        with self._lock:
            return self._session

    def _drop(self, session: ExecSession, exc: SessionBroken) -> None:
        """The session broke: closed, and the next one opened on a later round."""
        with self._lock:
            if self._session is session:
                self._session = None
                self._next_open = self._clock() + REOPEN_SECONDS
                self.broken += 1
        session.close()
        logger.warning(
            "exec session broke; falling back to one exec per call",
            extra={"container": self._container, "error": str(exc)},
        )

    def start(self, open_exec: OpenExec, stdin: bytes | None, user: str) -> None:
        """Start the command under the wrapper (started once, however often asked)."""
        exec_id, command = open_exec.id, list(open_exec.command)
        env, cwd = dict(open_exec.env), open_exec.cwd
        session = self._current()
        if session is not None:
            if stdin:
                self._engine.put_stdin(self._container, exec_id, stdin, user)
            try:
                session.start(exec_id, command, env=env, cwd=cwd)
                return
            except SessionBroken as exc:
                self._drop(session, exc)
                # Its stdin is in place already: written again, a started command could
                # read it changing under it.
                stdin = None
        self._engine.start_exec(
            self._container, exec_id, command, env=env, cwd=cwd, stdin=stdin, user=user
        )

    def poll(self, exec_id: uuid.UUID) -> ExecFiles:
        """What the container holds of the command."""
        session = self._current()
        if session is not None:
            try:
                return session.poll(exec_id)
            except SessionBroken as exc:
                self._drop(session, exc)
        return self._engine.poll_exec(self._container, exec_id)

    def read(self, exec_id: uuid.UUID, stream: str, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of the command's ``stream`` from ``offset``."""
        session = self._current()
        if session is not None:
            try:
                return session.read(exec_id, stream, offset, size)
            except SessionBroken as exc:
                self._drop(session, exc)
        return self._engine.read_exec(self._container, exec_id, stream, offset, size)

    def kill(self, exec_id: uuid.UUID) -> None:
        """SIGKILL the command."""
        session = self._current()
        if session is not None:
            try:
                session.kill(exec_id)
                return
            except SessionBroken as exc:
                self._drop(session, exc)
        self._engine.kill_exec(self._container, exec_id)
