"""RunNotifier.dispatch: payloads of one run id or several, comma-separated."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from runyard.reads.notify import RunNotifier

A, B, C = (uuid.UUID(int=n) for n in (1, 2, 3))


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (str(A), [A]),
        (f"{A},{B},{C}", [A, B, C]),
        ("default", []),  # a queue name on the jobs channel
        ("", []),
    ],
)
def test_dispatch__calls_listeners_for_every_run_named(payload: str, named: list[uuid.UUID]):
    notifier = RunNotifier("postgresql://unused")
    seen: list[uuid.UUID] = []
    notifier.add_listener(seen.append)
    notifier.dispatch(payload)
    assert seen == named


def test_dispatch__wakes_the_subscribers_of_a_run_in_a_list():
    async def scenario() -> tuple[bool, bool]:
        notifier = RunNotifier("postgresql://unused")
        with notifier.subscribe(B) as woken, notifier.subscribe(C) as idle:
            notifier.dispatch(f"{A},{B}")
            return await woken.wait(1.0), await idle.wait(0.05)

    assert asyncio.run(scenario()) == (True, False)


def test_subscribe__one_subscription_of_several_runs_wakes_for_any_and_leaves_nothing():
    async def scenario() -> tuple[bool, bool, int, int]:
        notifier = RunNotifier("postgresql://unused")
        with notifier.subscribe(A, B, B) as batch, notifier.subscribe(C) as other:
            inside = notifier.subscriber_count
            notifier.dispatch(str(B))
            woken, idle = await batch.wait(1.0), await other.wait(0.05)
        return woken, idle, inside, notifier.subscriber_count

    assert asyncio.run(scenario()) == (True, False, 2, 0)


def test_dispatch__with_a_listener_subscribers_of_a_long_payload_still_wake():
    async def scenario() -> tuple[bool, bool, list[uuid.UUID]]:
        notifier = RunNotifier("postgresql://unused")
        heard: list[uuid.UUID] = []
        notifier.add_listener(heard.append)
        others = [uuid.uuid4() for _ in range(199)]
        with notifier.subscribe(C) as woken, notifier.subscribe(A) as idle:
            notifier.dispatch(",".join(str(u) for u in [*others, C]))
            return await woken.wait(1.0), await idle.wait(0.05), heard

    woken, idle, heard = asyncio.run(scenario())
    assert (woken, idle) == (True, False)
    assert len(heard) == 200 and heard[-1] == C


@pytest.mark.parametrize("listening", [False, True])
def test_dispatch__a_subscription_of_some_channels_hears_only_those(listening: bool):
    async def scenario() -> list[bool]:
        notifier = RunNotifier("postgresql://unused")
        if listening:
            notifier.add_listener(lambda run_id: None)
        heard = []
        with (
            notifier.subscribe(A, channels=("runyard_runs",)) as ends,
            notifier.subscribe(A) as all_,
        ):
            notifier.dispatch(str(A), "runyard_events")
            heard += [await ends.wait(0.05), await all_.wait(1.0)]
            notifier.dispatch(str(A), "runyard_runs")
            heard += [await ends.wait(1.0), await all_.wait(1.0)]
        return heard

    assert asyncio.run(scenario()) == [False, True, True, True]
