"""Submitting a run: from a request the API has parsed to ``(run, created)``, in either mode.

The one path of every submit (the HTTP route, the dashboard's form): the tool and its input
are checked, then the run is enqueued (queue mode) or inserted claimed by this API process and
run inline (sync mode). Whether a request replays an earlier one is decided by the queue's
statements alone (``ApiQueue.submit``, ``ApiQueue.replay_or_refuse``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from runyard.domain.graph import GraphProblem, Node
from runyard.domain.states import RunMode, RunStatus
from runyard.platform.tracing import TraceContext, tracing
from runyard.queue import AdmissionCaps, AdmissionRefused, ApiQueue, EnqueueResult, NewRun
from runyard.queue.builds import BuildQueue
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter
from runyard.queue.values import QueuedRun
from runyard.reads.metrics import Metrics
from runyard.reads.run_view import RunView, trace_id_of
from runyard.reads.runs import RunReader
from runyard.registry.tools import ToolRegistry
from runyard.submission.quota import DailyQuota
from runyard.submission.request import RunRequest
from runyard.submission.results import REQUEST_ERRORS, submission_result
from runyard.submission.waits import Caller, Waits
from runyard.sync.executor import SyncExecutor
from runyard.traces.context import with_trace


class QueueModeOnly(Exception):
    """A workflow feature asked of an API that runs tools inline (sync mode)."""


SUBMIT_REQUEST_ERRORS = (*REQUEST_ERRORS, QueueModeOnly)


@dataclass(frozen=True)
class Submitted:
    """The run as it is when the submit answers, and whether this submit created it."""

    run: RunView
    created: bool


def queued_view(run: NewRun, run_id: uuid.UUID, queued: QueuedRun) -> RunView:
    """A run its submit just queued, as a read of it right after the commit shows it."""
    # Nothing of it has run: no attempt, result, error or output yet.
    not_run: dict[str, Any] = dict.fromkeys(
        ("result", "exit_code", "error_code", "error", "started_at", "finished_at")
    )
    return RunView(
        **not_run,
        id=run_id,
        tool=run.tool,
        status=RunStatus.QUEUED,
        mode=RunMode.QUEUE.value,
        input=queued.input,
        attempts=0,
        max_attempts=run.max_attempts,
        stdout_truncated=False,
        stderr_truncated=False,
        requested_at=queued.requested_at,
        waiting_for=queued.waiting_for,
        rerun_of=run.rerun_of,
        concurrency_key=run.concurrency_key,
        trace_id=trace_id_of(run.spec),
    )


def built_tag(run: NewRun) -> str | None:
    """The tag of the build a run waits for, if its tool is built from source."""
    build = run.spec.get("build")
    return str(build["tag"]) if isinstance(build, dict) and "tag" in build else None


class Submissions:
    """The submit use case over the queue, the registry and (sync mode) the inline executor."""

    def __init__(
        self,
        queue: ApiQueue,
        registry: ToolRegistry,
        caps: AdmissionCaps,
        waits: Waits,
        *,
        sync: SyncExecutor | None = None,
        builds: BuildQueue | None = None,
        metrics: Metrics | None = None,
        quota: DailyQuota | None = None,
    ) -> None:
        self._queue = queue
        # The tenants' daily CPU quota, checked before anything is written.
        self._quota = quota
        self._metrics = metrics or Metrics()
        # Submits of a digest whose build failed fail at once (until an admin rebuilds).
        self._builds = builds
        self._registry = registry
        self._caps = caps
        self._waits = waits
        self._sync = sync
        self._reader = RunReader(queue.engine)
        self._graphs = GraphWriter(queue.engine)

    def accept(
        self, request: RunRequest, *, read_back: bool, run_id: uuid.UUID | None = None
    ) -> tuple[EnqueueResult, RunView | None]:
        """Check, then enqueue, or in sync mode insert claimed (one thread hop, blocking).
        ``run_id``: the id a queued run is to have if this submit makes it.

        Raises ``UnknownTool``, ``InvalidInput``, ``AdmissionRefused``, ``IdempotencyConflict``.
        Counts the submit by result.
        """
        try:
            result, view = self._accept(request, read_back=read_back, run_id=run_id)
        except Exception as exc:
            label = submission_result(exc, request_errors=SUBMIT_REQUEST_ERRORS)
            self._metrics.submissions.labels(result=label).inc()
            raise
        self._metrics.submissions.labels(
            result=submission_result(None, created=result.created)
        ).inc()
        return result, view

    def _accept(
        self, request: RunRequest, *, read_back: bool, run_id: uuid.UUID | None
    ) -> tuple[EnqueueResult, RunView | None]:
        with tracing().span("submit") as span:
            result, view = self._submit(
                request, read_back=read_back, trace=span.context(), run_id=run_id
            )
            span.set("runyard.run_id", str(result.run_id))
        return result, view

    def _submit(
        self,
        request: RunRequest,
        *,
        read_back: bool,
        trace: TraceContext | None,
        run_id: uuid.UUID | None = None,
    ) -> tuple[EnqueueResult, RunView | None]:
        run = request.prepare(self._registry)
        if trace is not None:
            # The run's trace: its attempts' spans, wherever they run, are its children.
            run = dataclasses.replace(run, spec=with_trace(run.spec, trace))
        if self._quota is not None:
            self._quota.check(request.tenant)
        build_tag = built_tag(run)
        if build_tag is not None and self._sync is not None:
            raise QueueModeOnly(f"tool {run.tool!r} is built from source: its runs need queue mode")
        if request.in_graph:
            result = self._submit_in_graph(request, run)
        elif self._sync is not None:
            result = self._sync.claim_new(run, self._caps)
        else:
            result = self._queue.submit(run, self._caps, run_id=run_id)
        ended_at_once = 0
        if build_tag is not None and result.created and self._builds is not None:
            # A run of an image whose build failed ends here: its answer is read, not built.
            ended_at_once = self._builds.fail_waiting(build_tag)
        view = None
        if read_back and result.queued is not None and not ended_at_once:
            view = queued_view(run, result.run_id, result.queued)
        elif read_back and result.job is None:
            view = self._reader.view(result.run_id, request.tenant)
        return result, view

    def _submit_in_graph(self, request: RunRequest, run: NewRun) -> EnqueueResult:
        """A run with dependencies or a start time: one graph submit of a single run."""
        if self._sync is not None:
            raise QueueModeOnly(
                "depends_on and run_at need queue mode; this API runs tools inline (sync mode)"
            )
        if self._queue.queue_full(self._caps.max_queue_depth):
            raise AdmissionRefused("queue_full", self._caps.max_queue_depth)
        item = GraphRun(run, Node(None, request.depends_on), run_at=request.run_at)
        graph = GraphSubmit(request.tenant, [item], idempotency_key=request.idempotency_key)
        try:
            written = self._graphs.submit(graph, self._caps)
        except GraphProblem as exc:
            exc.index = None  # a single run's own field, not a batch item's
            raise
        return EnqueueResult(run_id=written.run_ids[0], created=written.created)

    async def submit(
        self,
        request: RunRequest,
        *,
        wait: float = 0.0,
        caller: Caller | None = None,
        accepted: Callable[[uuid.UUID], object] | None = None,
    ) -> Submitted:
        """Accept the request; run it inline (sync mode) or wait up to ``wait`` seconds
        (capped) for a terminal state. A caller that leaves cancels its inline run.
        ``accepted`` hears the run's id as soon as it is known, before any inline run."""
        caller = caller or Caller()
        seconds = self._waits.capped(wait)
        if seconds > 0 and self._sync is None and not request.in_graph:
            return await self._submit_and_wait(request, seconds, caller, accepted)
        accept = functools.partial(self.accept, request, read_back=seconds <= 0)
        result, view = await anyio.to_thread.run_sync(accept)
        if accepted is not None:
            accepted(result.run_id)
        if result.job is not None:
            assert self._sync is not None
            caller.on_leave(functools.partial(self._sync.cancel_local, result.run_id))
            # The slot's own thread runs it; this request only waits (``?wait`` does not apply).
            await asyncio.wrap_future(self._sync.start_job(result.job))
            seconds = 0.0
        if view is None:
            view = await self._waits.run(result.run_id, request.tenant, seconds, caller)
            assert view is not None  # the caller's own run
        return Submitted(run=view, created=result.created)

    async def _submit_and_wait(
        self,
        request: RunRequest,
        seconds: float,
        caller: Caller,
        accepted: Callable[[uuid.UUID], object] | None,
    ) -> Submitted:
        """Queue mode with a wait: the new run's end is listened for before it is written,
        so the submit's own answer is the first read and only its end costs another."""
        run_id = uuid.uuid4()
        with self._waits.hearing_end_of(run_id) as heard:
            accept = functools.partial(self.accept, request, read_back=True, run_id=run_id)
            result, view = await anyio.to_thread.run_sync(accept)
            if accepted is not None:
                accepted(result.run_id)
            if result.run_id == run_id:
                view = await self._waits.until_end(
                    run_id, heard, view, request.tenant, seconds, caller
                )
        if result.run_id != run_id:  # a replay: the run was made by an earlier submit
            view = await self._waits.run(result.run_id, request.tenant, seconds, caller)
        assert view is not None  # the caller's own run
        return Submitted(run=view, created=result.created)
