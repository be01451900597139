"""Waiting for a run or a batch to end (the long-polls ``?wait=S``): the one owner of it, for
a submit and for the reads of a run and of a batch.

A waiter subscribes to the run ids on the API's LISTEN connection, then reads; it sleeps
until a notification names one of its runs, or until ``poll_seconds`` pass (the safety net:
notifications may be lost), and reads again. No database connection is held while it
sleeps: every read borrows one for its statement only, on a worker thread. A submit that
waits subscribes before its run exists (``hearing_end_of``), so its own answer stands in
for the first read.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from runyard.domain.graph import ACTIVE
from runyard.queue import RUNS_CHANNEL
from runyard.reads.notify import RunNotifier, Subscription
from runyard.reads.run_view import RunView
from runyard.reads.runs import RunReader
from runyard.submission.batches import Batches, BatchView

T = TypeVar("T")

# Where every statement that ends a run names it. Its events (its start, each log chunk) and
# a return to the queue need not wake a waiter for its end.
END_CHANNELS = (RUNS_CHANNEL,)

# A batch's runs notify on every status change and log chunk: one waiter re-reads its batch at
# most this often, however many of its runs speak at once.
BATCH_READ_GAP_SECONDS = 0.25


@dataclass(frozen=True)
class WaitLimits:
    """How long a request may wait for a terminal state, and how often it re-reads meanwhile."""

    max_wait_seconds: float = 60.0
    poll_seconds: float = 2.0


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


class Waits:
    """Waits for runs and batches to end, sleeping on the run notifications between reads."""

    def __init__(
        self,
        notifier: RunNotifier,
        runs: RunReader,
        batches: Batches,
        limits: WaitLimits | None = None,
    ) -> None:
        self._notifier = notifier
        self._runs = runs
        self._batches = batches
        self.limits = limits or WaitLimits()

    def capped(self, seconds: float) -> float:
        """``seconds`` within ``max_wait_seconds`` (``RUNYARD_MAX_WAIT_SECONDS``)."""
        return max(min(seconds, self.limits.max_wait_seconds), 0.0)

    async def run(
        self, run_id: uuid.UUID, tenant: str | None, seconds: float, caller: Caller
    ) -> RunView | None:
        """The run once terminal, or as it is after ``seconds`` (capped), or when the caller
        leaves; None at once if ``tenant`` may not see it (None: any tenant)."""

        if self.capped(seconds) <= 0:
            return await anyio.to_thread.run_sync(self._runs.view, run_id, tenant)
        with self.hearing_end_of(run_id) as heard:
            # Subscribed first, then read: a change in between still wakes us.
            return await self.until_end(run_id, heard, None, tenant, seconds, caller)

    def hearing_end_of(self, run_id: uuid.UUID) -> contextlib.AbstractContextManager[Subscription]:
        """Hear ``run_id``'s end from now on. Entered before the run is written (a submit that
        waits), no end can pass unheard: the submit's own answer is then the first read."""
        return self._notifier.subscribe(run_id, channels=END_CHANNELS)

    async def until_end(
        self,
        run_id: uuid.UUID,
        heard: Subscription,
        found: RunView | None,
        tenant: str | None,
        seconds: float,
        caller: Caller,
    ) -> RunView | None:
        """The run once terminal, or as it is after ``seconds`` (capped), or when the caller
        leaves, woken by ``heard`` (``hearing_end_of``); ``found`` is the run as the caller
        knows it since subscribing (None: read it first)."""

        async def read() -> RunView | None:
            return await anyio.to_thread.run_sync(self._runs.view, run_id, tenant)

        return await self._until(
            read,
            lambda run: run.status.is_terminal,
            heard.wait,
            time.monotonic() + self.capped(seconds),
            caller,
            heard.wake,
            found,
        )

    async def batch(
        self, batch_id: uuid.UUID, tenant: str | None, seconds: float, caller: Caller
    ) -> BatchView | None:
        """The batch once terminal (no run queued or running), or as it is after ``seconds``
        (capped), or when the caller leaves; None at once if ``tenant`` may not see it."""
        view = await anyio.to_thread.run_sync(self._batches.view, batch_id, tenant)
        seconds = self.capped(seconds)
        if view is None or seconds <= 0 or view.status not in ACTIVE:
            return view
        deadline = time.monotonic() + seconds
        active = [run.run_id for run in view.runs if run.status in ACTIVE]

        async def status() -> str:
            return await anyio.to_thread.run_sync(self._batches.status, batch_id)

        with self._notifier.subscribe(*active, channels=END_CHANNELS) as subscription:
            gap = min(BATCH_READ_GAP_SECONDS, self.limits.poll_seconds)

            async def sleep(timeout: float) -> bool:
                woken = await subscription.wait(timeout)
                await anyio.sleep(min(gap, max(deadline - time.monotonic(), 0.0)))
                return woken

            # Subscribed after the first read: this lighter read sees a change in between.
            await self._until(
                status,
                lambda found: found not in ACTIVE,
                sleep,
                deadline,
                caller,
                subscription.wake,
            )
        return await anyio.to_thread.run_sync(self._batches.view, batch_id, tenant)

    async def _until(
        self,
        read: Callable[[], Awaitable[T | None]],
        done: Callable[[T], bool],
        sleep: Callable[[float], Awaitable[bool]],
        deadline: float,
        caller: Caller,
        wake: Callable[[], None],
        found: T | None = None,
    ) -> T | None:
        """Read (unless ``found`` is what a read would say now), then sleep and read again
        until ``done``, gone, past ``deadline`` or the caller left; what the last read found."""
        if found is None:
            found = await read()
        caller.on_leave(wake)
        while found is not None and not done(found) and not caller.left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await sleep(min(remaining, self.limits.poll_seconds))
            found = await read()
        return found
