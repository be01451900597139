"""The pure rules of schedules: a cadence's slots and what a pass fires (tables; no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runyard.domain.schedule_slots import (
    Cadence,
    CadenceProblem,
    CatchUp,
    Plan,
    cadence_problem,
    due_slots,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
GRACE = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def every(seconds: int, *, end: float | None = None) -> Cadence:
    return Cadence(None, seconds, "UTC", T0, None if end is None else at(end))


@pytest.mark.parametrize(
    ("cron", "every_seconds", "timezone", "field"),
    [
        (None, None, "UTC", "cron"),
        ("* * * * *", 60, "UTC", "cron"),
        ("* * * *", None, "UTC", "cron"),
        ("61 * * * *", None, "UTC", "cron"),
        ("* * * * * *", None, "UTC", "cron"),
        ("x" * 300, None, "UTC", "cron"),
        (None, 0, "UTC", "every_seconds"),
        (None, 400 * 86400, "UTC", "every_seconds"),
        ("0 9 * * *", None, "Mars/Olympus", "timezone"),
        ("0 9 * * *", None, "../../etc/passwd", "timezone"),
        (None, 5, "", "timezone"),
    ],
)
def test_cadence_problem__names_the_field_at_fault(
    cron: str | None, every_seconds: int | None, timezone: str, field: str
) -> None:
    problem = cadence_problem(cron, every_seconds, timezone)
    assert problem is not None and problem.field == field and str(problem)


@pytest.mark.parametrize(
    ("cron", "every_seconds", "timezone"),
    [("0 9 * * 1-5", None, "Europe/Berlin"), ("*/5 * * * *", None, "UTC"), (None, 1, "UTC")],
)
def test_cadence_problem__none_for_a_good_cadence(
    cron: str | None, every_seconds: int | None, timezone: str
) -> None:
    assert cadence_problem(cron, every_seconds, timezone) is None


def test_cadence__end_before_start_is_refused() -> None:
    with pytest.raises(CadenceProblem) as raised:
        Cadence(None, 5, "UTC", T0, at(-1))
    assert raised.value.field == "end_at"


@pytest.mark.parametrize(
    ("moment", "expected"),
    [(-100, 0), (0, 0), (0.5, 10), (10, 10), (11, 20), (95, None)],
)
def test_every__first_at_or_after(moment: float, expected: float | None) -> None:
    found = every(10, end=90).first_at_or_after(at(moment))
    assert found == (None if expected is None else at(expected))


def test_cron__slots_follow_the_time_zone_across_daylight_saving() -> None:
    start = datetime(2030, 3, 30, tzinfo=UTC)
    cadence = Cadence("0 9 * * *", None, "Europe/Berlin", start)
    first = cadence.first_at_or_after(start)
    assert first == datetime(2030, 3, 30, 8, tzinfo=UTC)  # 09:00 CET
    assert cadence.after(first) == datetime(2030, 3, 31, 7, tzinfo=UTC)  # 09:00 CEST


def test_cron__first_at_or_after_a_moment_within_a_minute_is_the_next_minute() -> None:
    cadence = Cadence("* * * * *", None, "UTC", T0)
    assert cadence.first_at_or_after(at(60.5)) == at(120)
    assert cadence.first_at_or_after(at(60)) == at(60)
    assert cadence.last_before(at(60), T0) == T0
    assert cadence.last_before(at(60.5), T0) == at(60)


S = [at(n) for n in range(0, 200, 10)]  # the slots of every(10)


@pytest.mark.parametrize(
    ("name", "cursor", "now", "catch_up", "limit", "expected"),
    [
        ("nothing due yet", 50, 45, CatchUp.ALL, 10, Plan((), 0, at(50))),
        ("on time, exactly", 50, 50, CatchUp.NONE, 10, Plan((S[5],), 0, at(60))),
        ("on time, two due", 50, 65, CatchUp.NONE, 10, Plan((S[5], S[6]), 0, at(70))),
        ("missed, none", 0, 100, CatchUp.NONE, 10, Plan((S[7], S[8], S[9], S[10]), 7, at(110))),
        ("missed, one", 0, 100, CatchUp.ONE, 10, Plan((S[6], *S[7:11]), 6, at(110))),
        ("missed, all", 0, 100, CatchUp.ALL, 20, Plan(tuple(S[0:11]), 0, at(110))),
        ("missed, all, limited", 0, 100, CatchUp.ALL, 3, Plan(tuple(S[0:3]), 0, at(30))),
        ("on time, limited", 70, 100, CatchUp.NONE, 2, Plan((S[7], S[8]), 0, at(90))),
        ("one, limited to one", 0, 100, CatchUp.ONE, 1, Plan((S[6],), 6, at(70))),
    ],
)
def test_due_slots__table(
    name: str, cursor: float, now: float, catch_up: CatchUp, limit: int, expected: Plan
) -> None:
    plan = due_slots(every(10), at(cursor), at(now), catch_up, grace=GRACE, limit=limit)
    assert plan == expected, name


def test_due_slots__past_end_at_the_schedule_is_finished() -> None:
    plan = due_slots(every(10, end=20), T0, at(25), CatchUp.ALL, grace=GRACE, limit=10)
    assert plan == Plan((S[0], S[1], S[2]), 0, None)


def test_due_slots__a_long_outage_is_skipped_without_walking_every_slot() -> None:
    cadence = every(1)
    now = T0 + timedelta(days=300)
    plan = due_slots(cadence, T0, now, CatchUp.NONE, grace=GRACE, limit=100)
    assert plan.fire[0] == now - GRACE and plan.fire[-1] == now
    assert plan.skipped == 10_000  # counted up to the cap (for the log)
    assert plan.next_slot_at == now + timedelta(seconds=1)


def test_due_slots__cron_one_fires_the_latest_missed_slot() -> None:
    cadence = Cadence("0 * * * *", None, "UTC", T0)  # hourly
    plan = due_slots(cadence, T0, at(5 * 3600 + 60), CatchUp.ONE, grace=GRACE, limit=10)
    assert plan == Plan((at(5 * 3600),), 5, at(6 * 3600))
