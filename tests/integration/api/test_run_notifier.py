"""The API's LISTEN connection: each notification reaches the subscribers of its run as it
arrives; a killed link heals and wakes every waiter; a link that stops answering its health
query is given up and made anew."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from runyard.platform.settings import libpq_url
from runyard.reads import notify
from runyard.reads.notify import RunNotifier

Body = Callable[[RunNotifier, psycopg.AsyncConnection], Awaitable[None]]


def with_notifier(database_url: str, body: Body) -> None:
    """Run ``body`` with a connected notifier and a connection to notify from."""

    async def main() -> None:
        notifier = RunNotifier(libpq_url(database_url))
        task = asyncio.create_task(notifier.run())
        try:
            await asyncio.wait_for(notifier.connected.wait(), 10)
            async with await psycopg.AsyncConnection.connect(
                libpq_url(database_url), autocommit=True
            ) as sender:
                await body(notifier, sender)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())


async def drained(waiter: notify.Subscription) -> None:
    """Take the wake-ups already given (the reconnect's own)."""
    while await waiter.wait(0.05):
        pass


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``condition`` holds (checked every 20 ms); fail after ``timeout``."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def send(sender: psycopg.AsyncConnection, channel: str, payload: str) -> None:
    await sender.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def test_notifications__reach_the_subscribers_of_their_runs_only(database_url: str):
    async def body(notifier: RunNotifier, sender: psycopg.AsyncConnection) -> None:
        mine, other = uuid.uuid4(), uuid.uuid4()
        with (
            notifier.subscribe(mine, channels=("runyard_runs",)) as ends,
            notifier.subscribe(other) as everything,
        ):
            await send(sender, "runyard_events", str(mine))  # not a channel `ends` hears
            await send(sender, "runyard_runs", str(mine))
            assert await ends.wait(10)
            assert not await everything.wait(0.3)
            # Many in one packet: a statement naming runs 200 a notification, then `other`.
            await sender.execute(
                "SELECT pg_notify('runyard_events', CAST(gen_random_uuid() AS text)) "
                "FROM generate_series(1, 500)"
            )
            await send(sender, "runyard_events", f"{uuid.uuid4()},{other}")
            assert await everything.wait(10)

    with_notifier(database_url, body)


def test_a_killed_link__heals_and_wakes_every_waiter(database_url: str):
    async def body(notifier: RunNotifier, sender: psycopg.AsyncConnection) -> None:
        run_id = uuid.uuid4()
        with notifier.subscribe(run_id, channels=("runyard_runs",)) as waiter:
            cursor = await sender.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND query LIKE 'LISTEN%'"
            )
            assert await cursor.fetchone() == (1,)
            assert await waiter.wait(10)  # something may have been missed: re-read
            await asyncio.wait_for(notifier.connected.wait(), 10)
            await drained(waiter)
            await send(sender, "runyard_runs", str(run_id))
            assert await waiter.wait(10)

    with_notifier(database_url, body)


@pytest.mark.slow  # sits out health queries, answered and then not
def test_a_link_that_stops_answering__is_made_anew(
    database_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(notify, "HEALTH_CHECK_SECONDS", 0.3)
    # Blocked behind a lock the sender holds: asked, never answered until it lets go.
    stuck = b"SELECT pg_advisory_lock(7301)"
    health = {"query": b"SELECT 1"}
    monkeypatch.setattr(notify._NotifyLink, "HEALTH_QUERY", property(lambda self: health["query"]))
    checks: list[float] = []
    check = notify._NotifyLink._check_health

    def counted(link: notify._NotifyLink, now: float) -> None:
        checks.append(now)
        check(link, now)

    monkeypatch.setattr(notify._NotifyLink, "_check_health", counted)

    async def body(notifier: RunNotifier, sender: psycopg.AsyncConnection) -> None:
        run_id = uuid.uuid4()
        await sender.execute("SELECT pg_advisory_lock(7301)")
        with notifier.subscribe(run_id, channels=("runyard_runs",)) as waiter:
            await until(lambda: len(checks) >= 3)  # the first two answered: the link stays
            assert notifier.connected.is_set() and not await waiter.wait(0.05)
            health["query"] = stuck
            assert await waiter.wait(10)  # given up: every waiter re-reads
            health["query"] = b"SELECT 1"
            await asyncio.wait_for(notifier.connected.wait(), 10)
            await drained(waiter)
            await send(sender, "runyard_runs", str(run_id))
            assert await waiter.wait(10)
        await sender.execute("SELECT pg_advisory_unlock(7301)")

    with_notifier(database_url, body)
