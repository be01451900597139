"""An MCP call's run: submitted through the one submit use case, waited for with the one
waiter (bounded by ``RUNYARD_MAX_WAIT_SECONDS``), its live logs sent as progress meanwhile,
and answered with its result, its artifacts and its id."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import mcp.types as types

from api.actions.artifacts import load_published
from api.actions.runs import load_run, submit_problem
from api.deps import Services, visible_tenant
from api.mcp.answers import problem_answer, run_answer
from api.problems import Problem
from runyard.reads.notify import Subscription
from runyard.reads.run_view import RunView
from runyard.reads.runs import LOG_STREAMS, RunReader
from runyard.submission.request import RunRequest
from runyard.submission.waits import Caller
from runyard.tenancy.auth import Principal

logger = logging.getLogger(__name__)

# ``(progress, total, message)``: the SDK's report of progress against the caller's token.
Progress = Callable[[float, float | None, str | None], Awaitable[None]]
# A task that sends progress until the event says the answer is ready.
Follower = Callable[[anyio.Event], Coroutine[Any, Any, None]]
T = TypeVar("T")

# Live logs as progress: one message holds at most this many characters, one call sends at
# most this many in all (the rest stays in the run's logs), logs are read at most this often,
# and the last lines of a run that ended get this long to go out before the answer.
PROGRESS_MESSAGE_CHARS = 4096
PROGRESS_TOTAL_CHARS = 1_048_576
PROGRESS_READ_GAP_SECONDS = 0.5
FINAL_LOGS_SECONDS = 2.0


@dataclass(frozen=True)
class RunCalls:
    """Runs for MCP calls, over the API's services."""

    services: Services

    async def call(
        self, principal: Principal, request: RunRequest, progress: Progress | None
    ) -> types.CallToolResult:
        """Submit ``principal``'s request, then wait for the run to end, its logs sent as
        progress meanwhile; a refusal is a tool error."""

        async def work(follow: Callable[[uuid.UUID], None]) -> types.CallToolResult:
            try:
                # Shielded: a call cancelled or cut off mid-way still leaves its run whole (in
                # sync mode it runs inline to its end); the answer names it for a later fetch.
                with anyio.CancelScope(shield=True):
                    submitted = await self.services.submissions.submit(
                        request, wait=0.0, accepted=follow
                    )
            except Exception as exc:
                problem = submit_problem(self.services, exc)
                if problem is None:
                    raise
                return problem_answer(problem)
            logger.info(
                "mcp call submitted a run",
                extra={
                    "run_id": str(submitted.run.id),
                    "tool": submitted.run.tool,
                    "replayed": not submitted.created,
                },
            )
            return await self.until_done(principal, submitted.run, self.max_wait)

        return await self._following(progress, work)

    @property
    def max_wait(self) -> float:
        """The longest a call waits for its run (``RUNYARD_MAX_WAIT_SECONDS``)."""
        return self.services.waits.limits.max_wait_seconds

    async def fetch(
        self, principal: Principal, run_id: uuid.UUID, wait: float, progress: Progress | None
    ) -> types.CallToolResult:
        """A run the caller may see, once it ends or after ``wait`` seconds (capped), its
        logs sent as progress meanwhile; a tool error ``run_not_found`` otherwise (another
        tenant's run included)."""
        view = await anyio.to_thread.run_sync(
            RunReader(self.services.engine).view, run_id, visible_tenant(principal)
        )
        if view is None:
            return problem_answer(Problem(404, "run_not_found", f"no run {run_id}"))

        async def work(follow: Callable[[uuid.UUID], None]) -> types.CallToolResult:
            if not view.status.is_terminal:
                follow(view.id)
            return await self.until_done(principal, view, wait)

        return await self._following(progress, work)

    async def _following(
        self,
        progress: Progress | None,
        work: Callable[[Callable[[uuid.UUID], None]], Awaitable[types.CallToolResult]],
    ) -> types.CallToolResult:
        """Run ``work``, which may ask to follow a run's logs (sent as ``progress``, if the
        client asked for it) until it returns."""

        async def followed(start: Callable[[Follower], None]) -> types.CallToolResult:
            def follow(run_id: uuid.UUID) -> None:
                if progress is not None:
                    start(functools.partial(self._send_logs, run_id, progress))

            return await work(follow)

        return await with_followers(followed)

    async def until_done(
        self, principal: Principal, view: RunView, wait: float
    ) -> types.CallToolResult:
        """The run's answer once it ends, or as it is after ``wait`` seconds (capped)."""
        seconds = self.services.waits.capped(wait)
        if not view.status.is_terminal and seconds > 0:
            started = time.monotonic()
            tenant = visible_tenant(principal)
            view = await self.services.waits.run(view.id, tenant, seconds, Caller()) or view
            seconds = time.monotonic() - started
        if not view.status.is_terminal:
            return run_answer(view, waited_seconds=round(seconds, 1))
        try:
            return await anyio.to_thread.run_sync(self._finished, principal, view)
        except Problem as problem:  # deleted in between
            return problem_answer(problem)

    def _finished(self, principal: Principal, view: RunView) -> types.CallToolResult:
        """A terminal run's answer with its artifacts (and its stdout, if it has no result)."""
        stdout = None
        if view.status.value == "succeeded" and view.result is None:
            stdout = load_run(self.services, principal, view.id).stdout
        published = load_published(self.services, principal, view.id)
        files = self.services.artifacts.files(published)
        return run_answer(view, stdout=stdout, artifacts=files)

    async def _send_logs(
        self, run_id: uuid.UUID, progress: Progress, finished: anyio.Event
    ) -> None:
        """Send the run's new log text as progress messages until ``finished`` (then once
        more, for the last lines), or the cap."""
        reader = RunReader(self.services.engine)
        attempt, cursor, sent = 0, 0, 0
        poll = self.services.waits.limits.poll_seconds
        with self.services.notifier.subscribe(run_id) as subscription:
            while sent < PROGRESS_TOTAL_CHARS:
                last = finished.is_set()
                view = await anyio.to_thread.run_sync(reader.view, run_id, None)
                if view is not None and view.attempts > 0:
                    if view.attempts != attempt:
                        attempt, cursor = view.attempts, 0  # a new attempt's logs start afresh
                    text = await anyio.to_thread.run_sync(
                        reader.live_logs, run_id, attempt, LOG_STREAMS
                    )
                    fresh = text[cursor : cursor + PROGRESS_TOTAL_CHARS - sent]
                    cursor += len(fresh)
                    for offset in range(0, len(fresh), PROGRESS_MESSAGE_CHARS):
                        chunk = fresh[offset : offset + PROGRESS_MESSAGE_CHARS]
                        sent += len(chunk)
                        # Progress only grows: the characters of log text sent so far.
                        if not await sent_progress(progress, float(sent), chunk):
                            return
                if last:
                    return
                await nap(subscription, finished, poll)
                if not finished.is_set():
                    await anyio.sleep(PROGRESS_READ_GAP_SECONDS)


async def with_followers(
    work: Callable[[Callable[[Follower], None]], Awaitable[T]],
) -> T:
    """Run ``work``, which may start followers (each told by an event when ``work`` has
    returned, then given a bound to send what is left: progress after the answer is not
    allowed). An error of ``work`` comes out as itself, not in an exception group."""
    outcome: list[T] = []
    failure: list[Exception] = []
    finished = anyio.Event()
    async with anyio.create_task_group() as followers:

        def start(follower: Follower) -> None:
            followers.start_soon(follower, finished)

        try:
            outcome.append(await work(start))
        except Exception as exc:
            failure.append(exc)
            followers.cancel_scope.cancel()
        finished.set()
        followers.cancel_scope.deadline = anyio.current_time() + FINAL_LOGS_SECONDS
    if failure:
        raise failure[0]
    return outcome[0]


async def nap(subscription: Subscription, finished: anyio.Event, seconds: float) -> None:
    """Sleep until a notification names the run, ``finished`` is set, or ``seconds`` pass."""
    async with anyio.create_task_group() as nap:

        async def until_finished() -> None:
            await finished.wait()
            nap.cancel_scope.cancel()

        nap.start_soon(until_finished)
        await subscription.wait(seconds)
        nap.cancel_scope.cancel()


async def sent_progress(progress: Progress, value: float, message: str) -> bool:
    """Send one progress message; False if the client can no longer hear it."""
    try:
        await progress(value, None, message)
    except Exception:  # the stream is gone: the run goes on, its logs stay stored
        logger.debug("mcp progress could not be sent", exc_info=True)
        return False
    return True
