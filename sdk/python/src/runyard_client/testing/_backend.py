"""The in-memory runyard behind the fake clients: runs, their events and artifacts, batches,
idempotency keys and the tenant's queued cap, with an instant worker that runs each queued
run (its dependencies met, its ``run_at`` past) when the next request comes in."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from runyard_client.testing._tools import FakeTool, run_tool

if TYPE_CHECKING:
    from runyard_client.testing._sandboxes import FakeCommand

ACTIVE = ("queued", "running")
# ``?wait=`` may ask for this much at most; the API holds an answer for its
# RUNYARD_MAX_WAIT_SECONDS (60 by default) at most.
MAX_WAIT_QUERY = 3600.0
MAX_WAIT_SECONDS = 60.0


class FakeProblem(Exception):
    """An error the fake API answers as a problem document."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.extra = status, code, detail, extra


def replayed(
    keys: dict[str, tuple[Any, uuid.UUID]], key: str | None, body: Any, what: str
) -> uuid.UUID | None:
    """What a request's ``Idempotency-Key`` made before (None: a new key or none); a 409
    when the key came with another body (``what``: "request", "batch")."""
    if key is None or key not in keys:
        return None
    first_body, made = keys[key]
    if first_body != body:
        detail = f"the Idempotency-Key was used with a different {what}"
        raise FakeProblem(409, "idempotency_conflict", detail, field="Idempotency-Key")
    return made


@dataclass
class FakeEvent:
    """One event of a run."""

    id: int
    type: str
    at: datetime
    data: dict[str, Any]


@dataclass
class FakeRun:
    """A run and what the fake keeps of it."""

    id: uuid.UUID
    tool: str
    input: Any
    requested_at: datetime
    priority: int = 0
    limits: dict[str, Any] = field(default_factory=dict)
    callback_url: str | None = None
    depends_on: tuple[uuid.UUID, ...] = ()
    run_at: datetime | None = None
    batch_id: uuid.UUID | None = None
    ref: str | None = None
    rerun_of: uuid.UUID | None = None
    status: str = "queued"
    result: Any = None
    exit_code: int | None = None
    attempts: int = 0
    error_code: str | None = None
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    stdout: str = ""
    stderr: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    events: list[FakeEvent] = field(default_factory=list)


@dataclass
class FakeBatch:
    """A batch: its refs in order, the latest run of each."""

    id: uuid.UUID
    created_at: datetime
    size: int
    refs: dict[str, uuid.UUID]


@dataclass
class RegisteredTool:
    """A fake tool and what ``GET /v1/tools`` shows of it."""

    name: str
    call: FakeTool
    description: str = ""
    input_schema: dict[str, Any] | None = None


class FakeBackend:
    """An in-memory runyard API for one tenant. Tools are Python callables; with ``auto_run``
    (the default) queued runs run when the next request arrives (a submit with ``wait`` runs
    its own), else only on ``run_pending()``. ``max_queued`` (0: none) mirrors
    ``RUNYARD_TENANT_MAX_QUEUED``, ``max_priority`` the key's ``max_priority``."""

    def __init__(
        self,
        tools: Mapping[str, FakeTool] | None = None,
        *,
        auto_run: bool = True,
        max_queued: int = 0,
        max_priority: int = 0,
        api_key: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sandbox_commands: FakeCommand | None = None,
    ) -> None:
        self.tools: dict[str, RegisteredTool] = {}
        for name, call in (tools or {}).items():
            self.register(name, call)
        self.auto_run = auto_run
        self.max_queued = max_queued
        self.max_priority = max_priority
        self.api_key = api_key
        self.clock = clock
        self.runs: dict[uuid.UUID, FakeRun] = {}
        self.batches: dict[uuid.UUID, FakeBatch] = {}
        self.keys: dict[str, tuple[Any, uuid.UUID]] = {}
        # Sandboxes of any registered tool; their commands answered by ``sandbox_commands``.
        from runyard_client.testing._sandboxes import FakeSandboxes  # it raises FakeProblem

        self.sandboxes = FakeSandboxes(sandbox_commands)
        self.lock = threading.RLock()
        self._event_ids = 0

    def register(
        self,
        name: str,
        call: FakeTool,
        *,
        description: str = "",
        input_schema: dict[str, Any] | None = None,
    ) -> None:
        """Add (or replace) a tool: ``call(input)`` or ``call(input, context)``."""
        self.tools[name] = RegisteredTool(name, call, description, input_schema)

    # --- runs ------------------------------------------------------------------------------

    def find(self, run_id: uuid.UUID) -> FakeRun:
        """A run, or 404."""
        run = self.runs.get(run_id)
        if run is None:
            raise FakeProblem(404, "run_not_found", f"no run {run_id}")
        return run

    def create(self, request: dict[str, Any], **links: Any) -> FakeRun:
        """Admit and write one run of a checked request (``tool``, ``input``, ...)."""
        if request["tool"] not in self.tools:
            detail = f"no tool named {request['tool']!r}; GET /v1/tools lists them"
            raise FakeProblem(422, "unknown_tool", detail, field="tool")
        if request.get("priority", 0) > self.max_priority:
            detail = f"priority {request['priority']} is above this key's maximum "
            raise FakeProblem(
                422, "above_maximum", detail + str(self.max_priority), field="priority"
            )
        queued = sum(1 for run in self.runs.values() if run.status == "queued")
        if self.max_queued and queued >= self.max_queued:
            raise FakeProblem(
                429,
                "tenant_queued_limit",
                f"the tenant has {queued} queued runs, its limit",
                limit=self.max_queued,
                headers={"Retry-After": "2"},
            )
        depends_on = tuple(links.pop("depends_on", request.get("depends_on", ())))
        for dependency in depends_on:
            if dependency not in self.runs:
                detail = f"depends_on names no run of yours: {dependency}"
                raise FakeProblem(422, "unknown_dependency", detail, field="depends_on")
        run = FakeRun(
            uuid.uuid4(),
            request["tool"],
            request.get("input", {}),
            self.clock(),
            priority=request.get("priority", 0),
            limits=dict(request.get("limits") or {}),
            callback_url=request.get("callback_url"),
            depends_on=depends_on,
            run_at=request.get("run_at"),
            **links,
        )
        self.runs[run.id] = run
        self._event(run, "status", status="queued")
        if self._unmet(run) or self._later(run):
            # As the API: not started before run_at, or before now when it waits on runs.
            not_before = max(run.run_at or run.requested_at, run.requested_at)
            self._event(run, "waiting", dependencies=self._unmet(run), run_at=not_before)
        self._settle_failed_dependencies()
        return run

    def view(self, run: FakeRun) -> dict[str, Any]:
        """The run as ``GET /v1/runs/{id}`` shows it."""
        waiting_on = [dep for dep in run.depends_on if self.runs[dep].status != "succeeded"]
        waiting_for = None
        if run.status == "queued" and waiting_on:
            waiting_for = f"{len(waiting_on)} of its dependencies to succeed"
        elif run.status == "queued" and self._later(run):
            waiting_for = "its run_at time"
        return {
            "id": run.id,
            "tool": run.tool,
            "status": run.status,
            "mode": "queue",
            "input": run.input,
            "result": run.result,
            "exit_code": run.exit_code,
            "attempts": run.attempts,
            "max_attempts": 1,
            "error_code": run.error_code,
            "error": run.error,
            "stdout_truncated": False,
            "stderr_truncated": False,
            "requested_at": run.requested_at,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
            "waiting_for": waiting_for,
            "depends_on": sorted(run.depends_on),
            "waiting_on": sorted(waiting_on),
            "batch_id": run.batch_id,
            "ref": run.ref,
            "rerun_of": run.rerun_of,
            "run_at": run.run_at,
        }

    def cancel(self, run: FakeRun) -> None:
        """Cancel a queued run; 409 once it has ended."""
        if run.status not in ACTIVE:
            detail = f"the run is already {run.status}"
            raise FakeProblem(409, "run_finished", detail, run_status=run.status)
        self._event(run, "cancel_requested")
        self._end(run, "cancelled", error_code="cancelled", error="cancelled while queued")
        self._settle_failed_dependencies()

    def delete(self, run: FakeRun) -> None:
        """Delete an ended run; 409 before it ends."""
        if run.status in ACTIVE:
            detail = (
                f"the run is {run.status}; only a terminal run can be deleted (cancel it first)"
            )
            raise FakeProblem(409, "run_not_finished", detail, run_status=run.status)
        del self.runs[run.id]

    def ended(self, run: FakeRun) -> None:
        """409 unless the run has ended (its artifacts are kept when it does)."""
        if run.status in ACTIVE:
            detail = f"the run is {run.status}; its artifacts are kept when it ends"
            raise FakeProblem(409, "run_not_finished", detail, run_status=run.status)

    # --- the worker ------------------------------------------------------------------------

    def run_pending(self) -> int:
        """Run every queued run that may start (dependencies met, ``run_at`` past), and those
        that become ready as they finish; how many ran."""
        ran = 0
        with self.lock:
            while True:
                ready = [
                    run
                    for run in self.runs.values()
                    if run.status == "queued" and not self._unmet(run) and not self._later(run)
                ]
                if not ready:
                    return ran
                ready.sort(key=lambda run: (-run.priority, run.requested_at))
                for run in ready:
                    if run.status == "queued":
                        self._execute(run)
                        ran += 1

    def tick(self) -> None:
        """What the instant worker does before a request is answered."""
        if self.auto_run:
            self.run_pending()

    def _execute(self, run: FakeRun) -> None:
        if run.depends_on and any(self.runs[d].status == "succeeded" for d in run.depends_on):
            self._event(run, "dependencies_met")
        run.attempts = 1
        run.started_at = self.clock()
        self._event(run, "claimed", attempt=1, worker_id="fake-worker")
        self._event(run, "status", status="running", attempt=1)
        run.status = "running"
        outcome = run_tool(self.tools[run.tool].call, run.input, run.id)
        for stream, text in outcome.output:
            until = self.clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
            self._event(run, stream, attempt=1, text=text, until=until)
        run.stdout, run.stderr = outcome.text("stdout"), outcome.text("stderr")
        run.files = dict(outcome.files)
        run.result, run.exit_code = outcome.result, outcome.exit_code
        status = "succeeded" if outcome.succeeded else "failed"
        self._end(run, status, error_code=outcome.error_code, error=outcome.error)
        self._settle_failed_dependencies()

    def _end(self, run: FakeRun, status: str, **fields: Any) -> None:
        run.status = status
        run.finished_at = self.clock()
        run.error_code, run.error = fields.get("error_code"), fields.get("error")
        data = {"status": status, "error_code": run.error_code}
        if run.attempts:
            data |= {"attempt": run.attempts, "exit_code": run.exit_code}
        self._event(run, "status", **data)

    def _settle_failed_dependencies(self) -> None:
        """A queued run fails ``dependency_failed`` once a run it depends on ended otherwise
        than succeeded (and so on down the graph)."""
        changed = True
        while changed:
            changed = False
            for run in self.runs.values():
                if run.status == "queued" and any(
                    self.runs[dep].status not in (*ACTIVE, "succeeded") for dep in run.depends_on
                ):
                    self._end(run, "failed", error_code="dependency_failed", error=None)
                    changed = True

    def _unmet(self, run: FakeRun) -> int:
        return sum(1 for dep in run.depends_on if self.runs[dep].status != "succeeded")

    def _later(self, run: FakeRun) -> bool:
        return run.run_at is not None and run.run_at > self.clock()

    def _event(self, run: FakeRun, kind: str, **data: Any) -> None:
        self._event_ids += 1
        run.events.append(FakeEvent(self._event_ids, kind, self.clock(), data))
