"""A runner without Docker, for tests and benchmarks that run against real Postgres.

``FakeRunner`` runs each attempt by calling a handler and remembers its containers the way an
engine would: it asks ``still_owner`` before it creates and starts a container, makes one left
``created`` anew, and raises ``RunnerUnavailable`` while ``unreachable`` is set. Integration
tests of the worker, the API (sync mode included) and the sweep use it, and ``bench.queue``
times the queue alone with it. It stands in for the engine only: the database is always real.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from runyard.domain.attempt import AttemptResult, AttemptSpec, ManagedAttempt
from runyard.domain.states import ContainerState, RunStatus
from runyard.runner import AttemptAbandoned, AttemptControl, RunnerUnavailable

Handler = Callable[[AttemptSpec, AttemptControl], AttemptResult]


def succeed_with_input(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
    """Default handler: the ``echo`` tool, without a container."""
    return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result=spec.input)


class FakeRunner:
    """Runs attempts by calling ``handler``; remembers containers like an engine would."""

    def __init__(self, handler: Handler = succeed_with_input, engine_id: str = "fake-engine"):
        self._handler = handler
        self._engine_id = engine_id
        self._lock = threading.Lock()
        self.containers: dict[tuple[uuid.UUID, int], ContainerState] = {}
        self.started: list[tuple[uuid.UUID, int]] = []
        self.discarded: list[tuple[uuid.UUID, int]] = []
        # Set: the engine answers nothing (ping, state and run raise RunnerUnavailable).
        self.unreachable = threading.Event()

    def engine_id(self) -> str:
        """The fake engine's id."""
        return self._engine_id

    def ping(self) -> None:
        """Raise while ``unreachable`` is set."""
        if self.unreachable.is_set():
            raise RunnerUnavailable("the fake engine is unreachable")

    def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
        """The remembered state, MISSING for unknown attempts."""
        self.ping()
        with self._lock:
            return self.containers.get((run_id, attempt), ContainerState.MISSING)

    def run(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        """Record the start, call the handler, mark the container exited."""
        key = (spec.run_id, spec.attempt)
        with self._lock:
            # A container left ``created`` is made anew, as the Docker adapter does.
            known = self.containers.get(key, ContainerState.CREATED) is not ContainerState.CREATED
        if not known:
            # Like the Docker adapter: ask the owner before the create and before the start.
            if not control.still_owner():
                raise AttemptAbandoned(spec.container_name)
            self.ping()
            with self._lock:
                self.containers[key] = ContainerState.CREATED
            if not control.still_owner():
                raise AttemptAbandoned(spec.container_name)
        self.ping()
        with self._lock:
            if not known:
                self.started.append(key)
            self.containers[key] = ContainerState.RUNNING
        result = self._handler(spec, control)
        with self._lock:
            self.containers[key] = ContainerState.EXITED
        return result

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Forget the container."""
        with self._lock:
            self.containers.pop((run_id, attempt), None)
            self.discarded.append((run_id, attempt))

    def managed_attempts(self) -> list[ManagedAttempt]:
        """Every remembered container."""
        with self._lock:
            return [
                ManagedAttempt(run_id, attempt, state is ContainerState.RUNNING)
                for (run_id, attempt), state in self.containers.items()
            ]
