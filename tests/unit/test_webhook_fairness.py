"""The pure rules of fair delivery: whose delivery goes next, and each destination's circuit
breaker (tables; no I/O)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runyard.domain.webhook_fairness import (
    Breaker,
    BreakerPolicy,
    Caps,
    Gate,
    Offer,
    admit,
    after_attempt,
    cooldown,
    gate,
    pick_deliveries,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
POLICY = BreakerPolicy(failures=3, cooldown_seconds=10, cooldown_max_seconds=60)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def offers(*specs: str) -> list[Offer]:
    """``"tenant@destination"`` each, due one second apart in the order given; ids name them
    (the n-th offer's id ends in n)."""
    made = []
    for n, spec in enumerate(specs):
        tenant, destination = spec.split("@")
        made.append(Offer(uuid.UUID(int=n), tenant, destination, at(n)))
    return made


def names(ids: tuple[uuid.UUID, ...] | list[uuid.UUID]) -> list[int]:
    return [i.int for i in ids]


# --- who goes next --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("specs", "in_flight", "slots", "caps", "expected"),
    [
        # Oldest first within a tenant; turns alternate between tenants, oldest tenant first.
        (["a@x", "a@x", "b@y"], [], 3, Caps(4, 4), [0, 2, 1]),
        # A tenant's flood does not keep another tenant's single delivery behind it.
        ([*["a@dead"] * 6, "b@live"], [], 2, Caps(8, 8), [0, 6]),
        # The tenant with fewer attempts in flight goes first, however old the other's are.
        (["a@x", "a@x", "b@y"], [("a", "x")], 1, Caps(4, 4), [2]),
        # A tenant at its cap gets nothing; the others get the slots.
        (["a@x", "a@y", "b@z"], [("a", "w"), ("a", "w")], 3, Caps(2, 4), [2]),
        (["a@x", "a@x", "a@x", "a@x"], [], 4, Caps(2, 4), [0, 1]),
        # A destination at its cap is skipped: the tenant's next destination goes instead.
        (["a@x", "a@x", "a@y"], [("b", "x")], 3, Caps(4, 2), [0, 2]),
        # The cap is across tenants: a shared destination gives its room in turns.
        (["a@x", "a@x", "b@x", "b@x"], [], 4, Caps(4, 2), [0, 2]),
        # No more than the free slots.
        (["a@x", "b@y", "c@z"], [], 2, Caps(4, 4), [0, 1]),
        ([], [], 4, Caps(4, 4), []),
        (["a@x"], [], 0, Caps(4, 4), []),
    ],
)
def test_pick_deliveries__turns_and_caps(
    specs: list[str],
    in_flight: list[tuple[str, str]],
    slots: int,
    caps: Caps,
    expected: list[int],
):
    picks = pick_deliveries(
        offers(*specs), in_flight, {}, slots=slots, caps=caps, policy=POLICY, now=at(100)
    )
    assert names(picks.claim) == expected
    assert picks.probes == {} and picks.defer == {}


def test_pick_deliveries__an_open_breaker_defers_its_tenants_deliveries_there_only():
    made = offers("a@dead", "a@dead", "a@live", "b@live", "b@dead")
    opened = {("a", "dead"): Breaker(failures=3, open_until=at(200))}
    picks = pick_deliveries(made, [], opened, slots=8, caps=Caps(4, 4), policy=POLICY, now=at(100))
    assert names(picks.claim) == [2, 3, 4]  # b's breaker there is its own, and closed
    assert picks.defer == {made[0].id: at(200), made[1].id: at(200)}
    assert picks.probes == {}


def test_pick_deliveries__a_cooled_down_breaker_gets_one_probe_of_its_tenant():
    made = offers("a@dead", "a@dead", "b@dead", "a@live")
    cooled = {("a", "dead"): Breaker(failures=3, open_until=at(50))}
    picks = pick_deliveries(made, [], cooled, slots=8, caps=Caps(4, 4), policy=POLICY, now=at(100))
    # One probe for a; a's other offer there waits for its outcome; b's goes as usual.
    assert names(picks.claim) == [0, 2, 3]
    assert picks.probes == {("a", "dead"): made[0].id}
    assert picks.defer == {}


def test_pick_deliveries__no_probe_while_an_attempt_of_its_tenant_there_is_in_flight():
    made = offers("a@dead", "b@live")
    cooled = {("a", "dead"): Breaker(failures=3, open_until=at(50))}
    args: dict[str, Any] = {"slots": 8, "caps": Caps(4, 4), "policy": POLICY, "now": at(100)}
    picks = pick_deliveries(made, [("a", "dead")], cooled, **args)
    assert names(picks.claim) == [1] and picks.probes == {}
    # Another tenant's attempt there does not hold back a's probe.
    picks = pick_deliveries(made, [("c", "dead")], cooled, **args)
    assert names(picks.claim) == [0, 1] and picks.probes == {("a", "dead"): made[0].id}


def test_pick_deliveries__tenants_whose_offers_all_wait_for_room_are_waiting():
    made = offers("a@full", "a@full", "b@full", "c@x", "c@y")
    args: dict[str, Any] = {"policy": POLICY, "now": at(100)}
    picks = pick_deliveries(made, [("d", "full")], {}, slots=8, caps=Caps(2, 1), **args)
    # a and b wait for room at "full"; c is at its cap (2), so it is not waiting for room.
    assert names(picks.claim) == [3, 4]
    assert picks.waiting == {"a", "b"}
    # Slots used up: nobody is told to look further.
    picks = pick_deliveries(made, [("d", "full")], {}, slots=1, caps=Caps(2, 1), **args)
    assert names(picks.claim) == [3] and picks.waiting == frozenset()


@pytest.mark.parametrize(
    ("specs", "in_flight", "caps", "expected"),
    [
        # Nothing claimed meanwhile: all of them.
        (["a@x", "b@x", "a@y"], [], Caps(2, 2), [0, 1, 2]),
        # Another process took a's room meanwhile: a's are dropped, in order, b's kept.
        (["a@x", "b@y", "a@z"], [("a", "w"), ("a", "w")], Caps(2, 4), [1]),
        (["a@x", "b@y", "a@z"], [("a", "w")], Caps(2, 4), [0, 1]),
        # Another process took the destination's room meanwhile.
        (["a@x", "b@x", "b@y"], [("c", "x")], Caps(4, 2), [0, 2]),
        (["a@x", "b@x"], [("c", "x"), ("d", "x")], Caps(4, 2), []),
        ([], [("c", "x")], Caps(4, 2), []),
        # A tenant holds at most half of a destination's room: the rest stays for others.
        (["a@x", "a@x", "a@x", "b@x"], [], Caps(4, 4), [0, 1, 3]),
        (["a@x", "b@x"], [("a", "x"), ("a", "x")], Caps(4, 4), [1]),
        (["a@x"], [], Caps(4, 1), [0]),  # a room of one is still a room
    ],
)
def test_admit__keeps_what_still_fits_both_caps(
    specs: list[str], in_flight: list[tuple[str, str]], caps: Caps, expected: list[int]
):
    assert names([o.id for o in admit(offers(*specs), in_flight, caps)]) == expected


def test_pick_deliveries__a_tenant_takes_at_most_half_of_a_destination():
    made = offers("a@x", "a@x", "a@x", "a@x", "a@y")
    picks = pick_deliveries(made, [], {}, slots=8, caps=Caps(8, 4), policy=POLICY, now=at(100))
    assert names(picks.claim) == [0, 1, 4]


def test_pick_deliveries__failures_below_the_threshold_change_nothing():
    made = offers("a@flaky", "a@flaky")
    flaky = {("a", "flaky"): Breaker(failures=2)}
    picks = pick_deliveries(made, [], flaky, slots=8, caps=Caps(4, 4), policy=POLICY, now=at(100))
    assert names(picks.claim) == [0, 1] and picks.probes == {} and picks.defer == {}


# --- the breaker ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "now", "expected"),
    [
        (Breaker(), 0, Gate.CLOSED),
        (Breaker(failures=2), 0, Gate.CLOSED),
        (Breaker(failures=3, open_until=at(10)), 5, Gate.OPEN),
        (Breaker(failures=3, open_until=at(10)), 10, Gate.PROBE),
        (Breaker(failures=7, open_until=at(10)), 11, Gate.PROBE),
        (Breaker(failures=3), 0, Gate.PROBE),  # open with no end: probe now
    ],
)
def test_gate__table(state: Breaker, now: float, expected: Gate):
    assert gate(state, at(now), POLICY) is expected


@pytest.mark.parametrize(
    ("state", "answered", "expected"),
    [
        # Any answer closes, from any state.
        (Breaker(), True, Breaker()),
        (Breaker(failures=2), True, Breaker()),
        (Breaker(failures=5, open_until=at(1000)), True, Breaker()),
        # Failures count up to the threshold, then open for the cool-down, doubling.
        (Breaker(), False, Breaker(failures=1)),
        (Breaker(failures=1), False, Breaker(failures=2)),
        (Breaker(failures=2), False, Breaker(failures=3, open_until=at(10))),
        (Breaker(failures=3, open_until=at(-1)), False, Breaker(failures=4, open_until=at(20))),
        (Breaker(failures=4, open_until=at(-1)), False, Breaker(failures=5, open_until=at(40))),
        (Breaker(failures=5, open_until=at(-1)), False, Breaker(failures=6, open_until=at(60))),
        (Breaker(failures=60, open_until=at(-1)), False, Breaker(failures=61, open_until=at(60))),
    ],
)
def test_after_attempt__table(state: Breaker, answered: bool, expected: Breaker):
    assert after_attempt(state, answered=answered, now=T0, policy=POLICY) == expected


@pytest.mark.parametrize(("failures", "seconds"), [(0, 10), (3, 10), (4, 20), (5, 40), (6, 60)])
def test_cooldown__doubles_from_the_threshold_up_to_the_max(failures: int, seconds: float):
    assert cooldown(failures, POLICY) == seconds


def test_breaker__a_dead_destination_opens_probes_and_closes_on_an_answer():
    state, now = Breaker(), T0
    for _ in range(3):
        assert gate(state, now, POLICY) is Gate.CLOSED
        state = after_attempt(state, answered=False, now=now, policy=POLICY)
    assert gate(state, now + timedelta(seconds=9), POLICY) is Gate.OPEN
    now += timedelta(seconds=10)
    assert gate(state, now, POLICY) is Gate.PROBE
    state = after_attempt(state, answered=False, now=now, policy=POLICY)  # the probe failed
    assert gate(state, now + timedelta(seconds=19), POLICY) is Gate.OPEN
    now += timedelta(seconds=20)
    assert gate(state, now, POLICY) is Gate.PROBE
    state = after_attempt(state, answered=True, now=now, policy=POLICY)  # it answered
    assert state == Breaker() and gate(state, now, POLICY) is Gate.CLOSED
