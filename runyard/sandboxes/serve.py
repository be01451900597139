"""Serving a sandbox's commands: start the pending ones, stream the output of the running
ones into the database by offset, end the exited ones, kill the overdue ones.

Every step is safe to repeat, so an owner that dies anywhere leaves nothing its adopter would
do twice: a command starts once (the wrapper's ``mkdir``), a chunk is stored only where the
stored bytes end (``APPEND_CHUNK``), a command finishes once (``FINISH_EXEC``), and only
after every byte it wrote is stored.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from runyard.domain.sandboxes import MAX_EXECS_CEILING, complete_utf8, exec_timed_out, startable
from runyard.registry.redact import Redactor
from runyard.sandbox_engine import ExecFiles, SandboxEngine
from runyard.sandboxes.channel import ExecChannel
from runyard.sandboxes.store import STREAMS, OpenExec, SandboxStore, Tick

logger = logging.getLogger(__name__)

# The most bytes read from one stream in one step, and the open commands looked at a round.
READ_BYTES = 1_048_576
OPEN_LIMIT = 64
# How long a command this owner started may go without its directory: the wrapper makes it
# in a process of its own, a moment after the start was asked for.
START_GRACE_SECONDS = 10.0


class ExecServer:
    """The commands of one sandbox, served a round at a time by its owner."""

    def __init__(
        self,
        engine: SandboxEngine,
        store: SandboxStore,
        run_id: uuid.UUID,
        container: str,
        *,
        user: str,
        output_cap: int,
        redactor: Callable[[], Redactor],
        wake: Callable[[], None] = lambda: None,
        start_grace_seconds: float = START_GRACE_SECONDS,
    ) -> None:
        self._engine = engine
        self._channel = ExecChannel(engine, container, wake=wake)
        self._store = store
        self._run_id = run_id
        self._container = container
        self._user = user
        self._cap = output_cap
        self._make_redactor = redactor
        self._redactor: Redactor | None = None
        # Commands found started: a missing directory after that means the sandbox's own
        # processes removed it. Commands this owner started, not found started yet (when):
        # their wrapper may still be on its way. Followed from several threads, so guarded.
        self._seen: set[uuid.UUID] = set()
        self._launched: dict[uuid.UUID, float] = {}
        self._seen_lock = threading.Lock()
        self._start_grace = start_grace_seconds
        self._ready = False
        self._pool = ThreadPoolExecutor(
            max_workers=MAX_EXECS_CEILING, thread_name_prefix=f"sandbox-{run_id}"
        )

    def close(self) -> None:
        """Stop the threads that follow commands (after the last round), and the session."""
        self._pool.shutdown(wait=True)
        self._channel.close()

    @property
    def ready(self) -> bool:
        """Whether the container was found running with its workspace made."""
        return self._ready

    def serve_once(self) -> Tick | None:
        """One round over the open commands; the tick it read (None without the row, or
        while the container is not ready: the engine is asked first, the database after)."""
        if not self._ready:
            if not self._engine.ready(self._container):
                return None
            self._store.mark_ready(self._run_id)
            self._ready = True
        tick = self._store.tick(self._run_id, OPEN_LIMIT)
        if tick is None:
            return None
        self._channel.ensure_open()
        if self._redactor is None:
            self._redactor = self._make_redactor()
        running = [e for e in tick.execs if e.status == "running"]
        # Each running command's poll and reads are engine round trips: side by side, one
        # command's output never waits behind another's.
        for _ in self._pool.map(lambda open_exec: self._follow(open_exec, tick), running):
            pass
        pending = [e for e in tick.execs if e.status == "pending"]
        for open_exec in pending[: startable(len(pending), len(running), tick.max_execs)]:
            self._start(open_exec)
        return tick

    def _start(self, open_exec: OpenExec) -> None:
        """Mark it running, then start it: a crash between the two leaves a running command
        whose directory is missing, which the next owner starts."""
        if self._store.mark_running(open_exec.id) is None:
            return
        self._launch(open_exec)

    def _launch(self, open_exec: OpenExec) -> None:
        stdin = self._store.stdin(open_exec.id) if open_exec.has_stdin else None
        self._channel.start(open_exec, stdin, self._user)
        with self._seen_lock:
            self._launched[open_exec.id] = time.monotonic()
        logger.info(
            "sandbox command started",
            extra={"run_id": str(self._run_id), "exec_id": str(open_exec.id)},
        )

    def _follow(self, open_exec: OpenExec, tick: Tick) -> None:
        """Store what a running command wrote since, and end it once it exited."""
        files = self._channel.poll(open_exec.id)
        if not files.started:
            with self._seen_lock:
                seen = open_exec.id in self._seen
                launched = self._launched.get(open_exec.id)
            if seen:
                self._store.finish(
                    open_exec.id, None, truncated=False, error="the command's output was removed"
                )
            elif launched is None:
                self._launch(open_exec)  # marked running, never started: a crash between
            elif time.monotonic() - launched > self._start_grace:
                self._store.finish(
                    open_exec.id, None, truncated=False, error="the command never started"
                )
            # Else started a moment ago: its wrapper has not made its directory yet.
            return
        with self._seen_lock:
            self._seen.add(open_exec.id)
            self._launched.pop(open_exec.id, None)
        caught_up = all(self._pump(open_exec, stream, files) for stream in STREAMS)
        if files.exit_code is not None:
            if caught_up:
                truncated = any(files.size(stream) > self._cap for stream in STREAMS)
                self._store.finish(open_exec.id, files.exit_code, truncated=truncated, error=None)
            return
        if not open_exec.timed_out and exec_timed_out(
            tick.db_now, open_exec.started_at, open_exec.timeout_seconds
        ):
            self._store.mark_timed_out(open_exec.id)
            self._channel.kill(open_exec.id)

    def _pump(self, open_exec: OpenExec, stream: str, files: ExecFiles) -> bool:
        """Store ``stream`` up to what the container holds (and the cap); True once every
        byte there is stored."""
        end = open_exec.end(stream)
        target = min(files.size(stream), self._cap)
        final = files.exit_code is not None
        redactor = self._redactor or Redactor(())
        while end < target:
            data = self._channel.read(open_exec.id, stream, end, min(READ_BYTES, target - end))
            if not data:
                return False
            if not final or end + len(data) < target:
                # Never split a character or a secret: the rest waits for the next read.
                data = data[: min(complete_utf8(data), redactor.safe_cut(data))]
                if not data:
                    return False
            if not self._store.append(open_exec.id, stream, end, len(data), redactor.mask(data)):
                return False  # stored by someone else: the next round reads the ends again
            end += len(data)
        return True
