"""LISTEN/NOTIFY for the API: one connection per process fans run ids out to waiting requests.

A waiting request (``?wait=S`` on a submit or a read of a run or a batch, an SSE stream)
subscribes to run ids and sleeps until a notification names one of them, or until its safety
timeout; either way it re-reads the
database, which stays the source of truth. No request holds a database connection while it
waits, and a lost LISTEN connection only makes waiters re-check sooner.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import anyio
import psycopg
from psycopg import pq, sql
from psycopg.pq.abc import PGconn

from runyard.queue import EVENTS_CHANNEL, RUNS_CHANNEL

logger = logging.getLogger(__name__)

# Runs' ends, and their events (status changes, log chunks, a return to the queue). Not the
# jobs channel: every enqueue speaks there, for the workers, and what it says of a run
# (given back to the queue) its events say too.
API_CHANNELS = (RUNS_CHANNEL, EVENTS_CHANNEL)
HEALTH_CHECK_SECONDS = 15.0


class Subscription:
    """Wake-ups for some run ids (from some channels, or all); ``wait`` returns True when a
    notification named one."""

    def __init__(
        self, run_ids: Sequence[uuid.UUID], channels: frozenset[str] | None = None
    ) -> None:
        self.run_ids = tuple(dict.fromkeys(run_ids))
        self.channels = channels
        self._event = asyncio.Event()

    def wake(self) -> None:
        """Called by the hub (in the event loop)."""
        self._event.set()

    def hears(self, channel: str | None) -> bool:
        """Whether a notification on ``channel`` (None: unknown) wakes this subscription."""
        return self.channels is None or channel is None or channel in self.channels

    async def wait(self, timeout: float) -> bool:
        """Sleep until woken or ``timeout`` seconds pass; clears the wake-up."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(timeout, 0.0))
        except TimeoutError:
            return False
        finally:
            self._event.clear()
        return True


class RunNotifier:
    """Listens on the run channels in the event loop; reconnects with backoff."""

    def __init__(self, database_url: str | None, channels: Sequence[str] = API_CHANNELS) -> None:
        self._url = database_url
        self._channels = tuple(channels)
        # By run id as text (``str(uuid)``, which is also how Postgres writes one).
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._listeners: list[Callable[[uuid.UUID], None]] = []
        self.connected = asyncio.Event()

    @contextmanager
    def subscribe(
        self, *run_ids: uuid.UUID, channels: Sequence[str] | None = None
    ) -> Iterator[Subscription]:
        """Register interest in ``run_ids`` (one wake-up for any of them) for the duration
        of the block; only notifications on ``channels`` wake it, if given (a waiter for a
        run's end needs no wake-up for each of its log chunks)."""
        subscription = Subscription(run_ids, None if channels is None else frozenset(channels))
        keys = {str(run_id) for run_id in subscription.run_ids}
        for key in keys:
            self._subscriptions.setdefault(key, set()).add(subscription)
        try:
            yield subscription
        finally:
            for key in keys:
                subs = self._subscriptions.get(key)
                if subs is not None:
                    subs.discard(subscription)
                    if not subs:
                        del self._subscriptions[key]

    def add_listener(self, callback: Callable[[uuid.UUID], None]) -> None:
        """Call ``callback(run_id)`` (in the event loop; it must not block) on every note."""
        self._listeners.append(callback)

    @property
    def subscriber_count(self) -> int:
        """How many subscriptions are open (for metrics and tests)."""
        return len({id(sub) for subs in self._subscriptions.values() for sub in subs})

    def dispatch(self, payload: str, channel: str | None = None) -> None:
        """Wake the subscribers of the runs the payload names (one run id, or several
        comma-separated: a statement's events) that hear ``channel``; other payloads are
        ignored."""
        if not self._listeners:
            # Waiters only: ids are matched as the text Postgres writes (a batch's 1,000 are
            # not parsed on the event loop); nothing else matches.
            for name in payload.split(","):
                for subscription in list(self._subscriptions.get(name, ())):
                    if subscription.hears(channel):
                        subscription.wake()
            return
        for name in payload.split(","):
            try:
                run_id = uuid.UUID(name)
            except ValueError:
                return  # not a run id: nothing of ours
            for subscription in list(self._subscriptions.get(str(run_id), ())):
                if subscription.hears(channel):
                    subscription.wake()
            for callback in self._listeners:
                try:
                    callback(run_id)
                except Exception:
                    logger.exception("notification listener failed")

    def _wake_all(self) -> None:
        for subs in list(self._subscriptions.values()):
            for subscription in list(subs):
                subscription.wake()

    async def run(self) -> None:
        """Listen until cancelled; without a URL (behind a transaction pooler with no direct
        one) never: waiters then wake on their poll only."""
        if self._url is None:
            return
        delay = 0.5
        while True:
            try:
                await self._listen()
            except (psycopg.Error, OSError) as exc:
                self.connected.clear()
                logger.warning("listen connection lost; reconnecting", extra={"error": str(exc)})
                # Something may have been missed while disconnected: let every waiter re-check.
                self._wake_all()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            else:
                delay = 0.5

    async def _listen(self) -> None:
        assert self._url is not None
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, connect_timeout=5)
        try:
            for channel in self._channels:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self.connected.set()
            self._wake_all()
            await _NotifyLink(conn.pgconn, self.dispatch).serve()
        finally:
            self.connected.clear()
            # Closing must finish even while the listening task is being cancelled.
            with anyio.CancelScope(shield=True):
                await conn.close()


class _NotifyLink:
    """A LISTEN connection served from the event loop's own readiness callback: each
    notification is dispatched as its bytes arrive, and nothing runs in between but a query
    every ``HEALTH_CHECK_SECONDS`` that proves the link. (psycopg's ``notifies()`` wakes
    every 0.1 s to re-arm its wait, and re-arms it for each notification: most of an idle
    API's CPU, and most of what a notification cost it.)"""

    HEALTH_QUERY = b"SELECT 1"

    def __init__(self, pgconn: PGconn, dispatch: Callable[[str, str | None], None]) -> None:
        self._pgconn = pgconn
        self._dispatch = dispatch
        self._asked_at: float | None = None  # when the unanswered health query was sent
        self._broken: asyncio.Future[None] | None = None

    async def serve(self) -> None:
        """Dispatch notifications until the link breaks (raised) or the task is cancelled."""
        loop = asyncio.get_running_loop()
        self._broken = loop.create_future()
        fd = self._pgconn.socket
        loop.add_reader(fd, self._readable)
        try:
            self._readable()  # what arrived with the LISTENs' answers
            while True:
                done, _ = await asyncio.wait({self._broken}, timeout=HEALTH_CHECK_SECONDS)
                if done:
                    self._broken.result()  # raises why
                self._check_health(loop.time())
        finally:
            loop.remove_reader(fd)
            if self._broken.done():
                self._broken.exception()  # retrieved, whatever ended the task

    def _readable(self) -> None:
        assert self._broken is not None
        if self._broken.done():
            return  # a socket at its end stays readable until the reader goes
        try:
            self._pgconn.consume_input()
            while (note := self._pgconn.notifies()) is not None:
                self._dispatch(_text(note.extra), _text(note.relname))
            if self._asked_at is not None:
                self._collect_health()
        except Exception as exc:
            if not self._broken.done():
                self._broken.set_exception(exc)

    def _check_health(self, now: float) -> None:
        if self._asked_at is not None:
            raise psycopg.OperationalError(
                f"the listen connection did not answer a query in {HEALTH_CHECK_SECONDS:.0f} s"
            )
        self._pgconn.send_query(self.HEALTH_QUERY)
        if self._pgconn.flush() != 0:  # a 9-byte query that does not fit the socket
            raise psycopg.OperationalError("the listen connection does not take a query")
        self._asked_at = now

    def _collect_health(self) -> None:
        while not self._pgconn.is_busy():
            result = self._pgconn.get_result()
            if result is None:
                self._asked_at = None  # answered
                return
            if result.status != pq.ExecStatus.TUPLES_OK:
                message = _text(result.error_message) or str(result.status)
                raise psycopg.OperationalError(f"the listen connection's check failed: {message}")


def _text(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")
