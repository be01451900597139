"""A sandbox held as an attempt: the runner keeps its container, this serves its commands.

``SandboxRunner`` wraps the runner the attempt owner calls. A run of a sandbox (its snapshot
has ``sandbox_session``) is handed to the wrapped runner on a thread of its own, which
creates or adopts the container, stops it at the TTL (the run's deadline) or on a delete (the
run's cancel) and reports its exit as for any run; meanwhile this thread serves the
sandbox's commands (``ExecServer``) and stops the container when it is idle. Any other run
goes straight to the wrapped runner.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from runyard.domain.attempt import AttemptResult, AttemptSpec, ManagedAttempt
from runyard.domain.sandboxes import EndFacts, end_of, idle_passed
from runyard.domain.states import ContainerState
from runyard.platform.tracing import tracing
from runyard.registry.redact import Redactor
from runyard.runner import AttemptControl, Runner
from runyard.sandbox_engine import SandboxEngine, SandboxNotRunning
from runyard.sandboxes.serve import ExecServer
from runyard.sandboxes.store import SandboxStore
from runyard.sandboxes.wakeups import ExecWakeups

logger = logging.getLogger(__name__)

SESSION_KEY = "sandbox_session"
# A round this often while commands are open, else at least
# every IDLE_POLL_SECONDS, sooner when a new command's notification wakes it.
POLL_SECONDS = 0.1
IDLE_POLL_SECONDS = 1.0
# Without notifications (a transaction pooler and no direct URL) an idle sandbox looks this
# often: a new command waits at most this long, and an idle sandbox costs no more rounds.
UNNOTIFIED_IDLE_POLL_SECONDS = 0.5
# Once the container is being started and until it is ready (a stat through the engine's
# API, no process started in it): the sandbox is ready this soon after its keeper made the
# workspace. An adopted container is found ready at the first round.
READY_POLL_SECONDS = 0.005


@dataclass(frozen=True)
class _Parts:
    """What every sandbox session of a process shares."""

    inner: Runner
    engine: SandboxEngine
    store: SandboxStore
    wakeups: ExecWakeups
    poll_seconds: float


def watch_start(control: AttemptControl, woken: threading.Event) -> threading.Event:
    """An event set (and ``woken`` with it) when the runner is about to start the container:
    its second ownership check, the first coming before the create. Readiness is looked for
    often only from then on, not while the engine creates the container."""
    starting = threading.Event()
    checks = [0]
    owner_check = control.still_owner

    def still_owner() -> bool:
        checks[0] += 1
        if checks[0] >= 2:
            starting.set()
            woken.set()
        return owner_check()

    control.still_owner = still_owner
    return starting


class SandboxRunner:
    """The runner port, with sandboxes served beside their containers."""

    def __init__(
        self,
        inner: Runner,
        engine: SandboxEngine,
        store: SandboxStore,
        *,
        wakeups: ExecWakeups | None = None,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self._inner = inner
        self._parts = _Parts(inner, engine, store, wakeups or ExecWakeups(None), poll_seconds)

    def engine_id(self) -> str:
        """The wrapped runner's engine."""
        return self._inner.engine_id()

    def ping(self) -> None:
        """Ask the wrapped runner's engine."""
        self._inner.ping()

    def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
        """The attempt's container, as the wrapped runner sees it."""
        return self._inner.state(run_id, attempt)

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove the attempt's container and volume."""
        self._inner.discard(run_id, attempt)

    def managed_attempts(self) -> list[ManagedAttempt]:
        """The wrapped runner's labelled attempts."""
        return self._inner.managed_attempts()

    def run(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        """A sandbox's attempt: its container kept and its commands served; any other run:
        the wrapped runner's."""
        session = spec.tool.get(SESSION_KEY)
        if not isinstance(session, dict):
            return self._inner.run(spec, control)
        return _Session(self._parts, spec, control, session).run()


class _Session:
    """One attempt of one sandbox in this process."""

    def __init__(
        self,
        parts: _Parts,
        spec: AttemptSpec,
        control: AttemptControl,
        session: dict[str, Any],
    ) -> None:
        self._parts = parts
        self._spec = spec
        self._control = control
        self._session = session
        self._result: AttemptResult | None = None
        self._error: BaseException | None = None
        self._stopped_idle = False
        # Trouble is logged once until a round succeeds again, not every round of an outage.
        self._troubled = False

    def _hold_container(self) -> None:
        try:
            self._result = self._parts.inner.run(self._spec, self._control)
        except BaseException as exc:
            self._error = exc

    def run(self) -> AttemptResult:
        spec, control, store = self._spec, self._control, self._parts.store
        # A sandbox keeps no artifacts: its files are read while it lives.
        control.artifacts = None
        store.insert_sandbox(
            spec.run_id,
            str(self._session["tenant"]),
            str(spec.tool["name"]),
            int(self._session["idle_timeout_seconds"]),
            int(self._session["max_execs"]),
        )
        wakeups = self._parts.wakeups
        woken = wakeups.event(spec.run_id)
        starting = watch_start(control, woken)
        holder = threading.Thread(
            target=self._hold_container, name=f"sandbox-{spec.run_id}", daemon=True
        )
        holder.start()
        server = ExecServer(
            self._parts.engine,
            # Each command a span of this attempt's (this thread holds it open).
            store.traced(tracing(), tracing().current()),
            spec.run_id,
            spec.container_name,
            user=str(spec.tool.get("user", "65534:65534")),
            output_cap=int(self._session["output_cap_bytes"]),
            redactor=self._redactor,
            wake=woken.set,  # a command the session started exited
        )
        try:
            while holder.is_alive():
                busy = True
                if not control.abandon.is_set() and not control.cancel.is_set():
                    busy = self._round(server)
                idle_wait = IDLE_POLL_SECONDS if wakeups.listening else UNNOTIFIED_IDLE_POLL_SECONDS
                wait = self._parts.poll_seconds if busy else idle_wait
                if not server.ready and starting.is_set():
                    wait = READY_POLL_SECONDS
                woken.wait(wait)
                woken.clear()
        finally:
            wakeups.forget(spec.run_id)
            server.close()
        holder.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._end(self._result)

    def _redactor(self) -> Redactor:
        names = sorted(self._spec.tool.get("secrets") or {})
        return Redactor(self._parts.engine.secret_values(self._spec.container_name, names))

    def _round(self, server: ExecServer) -> bool:
        """Serve the commands once and stop the sandbox if it is idle; trouble is logged and
        the next round tries again (the runner notices a dead engine on its own). No lease
        check per round: every write here is idempotent (see ``ExecServer``), and a lost
        lease stops the rounds through ``abandon``."""
        try:
            tick = server.serve_once()
        except SandboxNotRunning:
            return True
        except Exception as exc:  # the engine or the database: the next round tries again
            if not self._troubled:
                logger.warning("sandbox round failed", extra=self._log(error=repr(exc)))
            self._troubled = True
            return True
        self._troubled = False
        if tick is None:
            return True
        running = sum(1 for e in tick.execs if e.status == "running")
        if idle_passed(tick.db_now, tick.last_active_at, tick.idle_timeout_seconds, running):
            logger.info("sandbox idle; stopping it", extra=self._log(action="idle"))
            self._stopped_idle = True
            self._control.cancel.set()
        # Busy while commands are open or the container is not ready yet.
        return bool(tick.execs) or not server.ready

    def _end(self, outcome: AttemptResult) -> AttemptResult:
        """The container stopped: the sandbox's outcome, and its open commands ended."""
        spec, control = self._spec, self._control
        idle = self._stopped_idle
        if not idle:
            tick = self._parts.store.tick(spec.run_id, limit=1)
            idle = tick is not None and idle_passed(
                tick.db_now, tick.last_active_at, tick.idle_timeout_seconds, 0
            )
        end = end_of(
            EndFacts(
                delete_requested=control.cancel.is_set() and not self._stopped_idle,
                ttl_passed=control.clock() >= spec.deadline_at,
                idle_passed=idle,
                exit_code=outcome.exit_code,
                status=outcome.status,
                error_code=outcome.error_code,
            )
        )
        self._parts.store.end_open(spec.run_id, "the sandbox ended before the command did")
        return AttemptResult(
            status=end.status,
            exit_code=outcome.exit_code,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            stdout_truncated=outcome.stdout_truncated,
            stderr_truncated=outcome.stderr_truncated,
            error_code=end.error_code,
            error=end.error or outcome.error,
            image_digest=outcome.image_digest,
            # What the sandbox's container consumed, metered like any run's attempt.
            usage=outcome.usage,
        )

    def _log(self, **more: object) -> dict[str, object]:
        return {"run_id": str(self._spec.run_id), "attempt": self._spec.attempt, **more}
