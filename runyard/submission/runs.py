"""Submitting a run: from a request the API has parsed to ``(run, created)``, in either mode.

The one path of every submit (the HTTP route, the dashboard's form): the tool and its input
are checked, then the run is enqueued (queue mode) or inserted claimed by this API process and
run inline (sync mode). Whether a request replays an earlier one is decided by the queue's
statements alone (``ApiQueue.submit``, ``ApiQueue.replay_or_refuse``).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from runyard.domain.graph import GraphProblem, Node
from runyard.queue import AdmissionCaps, AdmissionRefused, ApiQueue, EnqueueResult, NewRun
from runyard.queue.builds import BuildQueue
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter
from runyard.reads.metrics import Metrics
from runyard.reads.notify import RunNotifier
from runyard.reads.runs import RunReader, RunView
from runyard.registry.tools import ToolRegistry
from runyard.submission.request import RunRequest
from runyard.submission.results import REQUEST_ERRORS, submission_result
from runyard.sync.executor import SyncExecutor


class QueueModeOnly(Exception):
    """A workflow feature asked of an API that runs tools inline (sync mode)."""


SUBMIT_REQUEST_ERRORS = (*REQUEST_ERRORS, QueueModeOnly)


@dataclass(frozen=True)
class Submitted:
    """The run as it is when the submit answers, and whether this submit created it."""

    run: RunView
    created: bool


class Caller:
    """Whether the caller is still there: leaving cancels its inline run and ends its wait."""

    def __init__(self) -> None:
        self._hooks: list[Callable[[], object]] = []
        self.left = False

    def on_leave(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` when the caller leaves (at once if it has)."""
        self._hooks.append(hook)
        if self.left:
            hook()

    def leave(self) -> None:
        """The caller went away."""
        self.left = True
        for hook in list(self._hooks):
            hook()


@dataclass(frozen=True)
class WaitLimits:
    """How long a submit may wait for a terminal state, and how often it re-reads meanwhile."""

    max_wait_seconds: float = 60.0
    poll_seconds: float = 2.0


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
        notifier: RunNotifier,
        *,
        sync: SyncExecutor | None = None,
        limits: WaitLimits | None = None,
        builds: BuildQueue | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._queue = queue
        self._metrics = metrics or Metrics()
        # Submits of a digest whose build failed fail at once (until an admin rebuilds).
        self._builds = builds
        self._registry = registry
        self._caps = caps
        self._notifier = notifier
        self._sync = sync
        self._limits = limits or WaitLimits()
        self._reader = RunReader(queue.engine)
        self._graphs = GraphWriter(queue.engine)

    def accept(
        self, request: RunRequest, *, read_back: bool
    ) -> tuple[EnqueueResult, RunView | None]:
        """Check, then enqueue, or in sync mode insert claimed (one thread hop, blocking).

        Raises ``UnknownTool``, ``InvalidInput``, ``AdmissionRefused``, ``IdempotencyConflict``.
        Counts the submit by result.
        """
        try:
            result, view = self._accept(request, read_back=read_back)
        except Exception as exc:
            label = submission_result(exc, request_errors=SUBMIT_REQUEST_ERRORS)
            self._metrics.submissions.labels(result=label).inc()
            raise
        self._metrics.submissions.labels(
            result=submission_result(None, created=result.created)
        ).inc()
        return result, view

    def _accept(
        self, request: RunRequest, *, read_back: bool
    ) -> tuple[EnqueueResult, RunView | None]:
        run = request.prepare(self._registry)
        build_tag = built_tag(run)
        if build_tag is not None and self._sync is not None:
            raise QueueModeOnly(f"tool {run.tool!r} is built from source: its runs need queue mode")
        if request.in_graph:
            result = self._submit_in_graph(request, run)
        elif self._sync is not None:
            result = self._sync.claim_new(run, self._caps)
        else:
            result = self._queue.submit(run, self._caps)
        if build_tag is not None and result.created and self._builds is not None:
            self._builds.fail_waiting(build_tag)
        view = None
        if read_back and result.job is None:
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
        self, request: RunRequest, *, wait: float = 0.0, caller: Caller | None = None
    ) -> Submitted:
        """Accept the request; run it inline (sync mode) or wait up to ``wait`` seconds
        (capped) for a terminal state. A caller that leaves cancels its inline run."""
        caller = caller or Caller()
        seconds = min(wait, self._limits.max_wait_seconds)
        accept = functools.partial(self.accept, request, read_back=seconds <= 0)
        result, view = await anyio.to_thread.run_sync(accept)
        if result.job is not None:
            assert self._sync is not None
            caller.on_leave(functools.partial(self._sync.cancel_local, result.run_id))
            # The slot's own thread runs it; this request only waits (``?wait`` does not apply).
            await asyncio.wrap_future(self._sync.start_job(result.job))
            seconds = 0.0
        if view is None:
            view = await self.wait_for(result.run_id, request.tenant, seconds, caller)
        return Submitted(run=view, created=result.created)

    async def _view(self, run_id: uuid.UUID, tenant: str) -> RunView:
        view = await anyio.to_thread.run_sync(self._reader.view, run_id, tenant)
        assert view is not None  # the caller's own run
        return view

    async def wait_for(
        self, run_id: uuid.UUID, tenant: str, seconds: float, caller: Caller
    ) -> RunView:
        """The run once terminal, or as it is after ``seconds``; it sleeps on the run's
        NOTIFY channel and re-reads at most every ``poll_seconds``; leaving ends it."""
        if seconds <= 0:
            return await self._view(run_id, tenant)
        deadline = time.monotonic() + seconds
        with self._notifier.subscribe(run_id) as subscription:
            # Subscribed first, then read: a change in between still wakes us.
            run = await self._view(run_id, tenant)
            caller.on_leave(subscription.wake)
            while not run.status.is_terminal and not caller.left:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await subscription.wait(min(remaining, self._limits.poll_seconds))
                run = await self._view(run_id, tenant)
            return run
