"""A schedule's slots and which of them a scheduler pass fires: the pure rules of schedules.

**Slots.** A schedule has a cadence: a cron expression (five fields, read in the schedule's
IANA time zone, so ``0 9 * * *`` is nine in the morning there, summer and winter) or a fixed
period (``every_seconds``, counted from ``start_at``). Its slots are the times the cadence
names from ``start_at`` on, up to ``end_at`` when it has one.

**Due slots.** A pass at ``now`` looks at the slots from the schedule's cursor (its first slot
not yet decided) up to ``now``. A slot at most ``grace`` old is on time and always fires. An
older one was missed (every scheduler was down, or the schedule was behind); ``catch_up`` says
what happens to those: ``none`` skips them, ``one`` fires the latest of them only, ``all``
fires each, oldest first. A pass fires at most ``limit`` slots of one schedule; the cursor
moves past every slot it decided (fired or skipped) and no further, so the next pass goes on
from there. A schedule whose next slot is past ``end_at`` is finished (cursor None).
"""

from __future__ import annotations

import enum
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

# The shortest period a schedule may have, and the longest (a cron expression has its own).
MIN_EVERY_SECONDS = 1
MAX_EVERY_SECONDS = 366 * 86400
MAX_CRON_LENGTH = 200
# cronsim steps one second before a time to find the slots at or after it (cron slots fall on
# whole minutes).
_STEP = timedelta(seconds=1)


class CatchUp(enum.StrEnum):
    """What a pass does with the slots it missed."""

    NONE = "none"
    ONE = "one"
    ALL = "all"


class CadenceProblem(ValueError):
    """A cadence that cannot be used; ``field`` names the request field at fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Cadence:
    """When a schedule's slots fall: exactly one of ``cron`` and ``every_seconds``."""

    cron: str | None
    every_seconds: int | None
    timezone: str
    start_at: datetime
    end_at: datetime | None = None

    def __post_init__(self) -> None:
        problem = cadence_problem(self.cron, self.every_seconds, self.timezone)
        if problem is not None:
            raise problem
        if self.end_at is not None and self.end_at < self.start_at:
            raise CadenceProblem("end_at is before start_at", "end_at")

    def first_at_or_after(self, moment: datetime) -> datetime | None:
        """The first slot at or after ``moment`` (never before ``start_at``), None past
        ``end_at``."""
        moment = max(moment, self.start_at)
        slot: datetime | None
        if self.every_seconds is not None:
            period = timedelta(seconds=self.every_seconds)
            steps = -((self.start_at - moment) // period)  # ceiling division
            slot = self.start_at + steps * period
        else:
            assert self.cron is not None
            zone = zoneinfo.ZoneInfo(self.timezone)
            found = None
            for found in CronSim(self.cron, (moment - _STEP).astimezone(zone)):
                if found >= moment:  # a moment within a minute starts one step early
                    break
            slot = None if found is None else found.astimezone(UTC)
        if slot is None or (self.end_at is not None and slot > self.end_at):
            return None
        return slot

    def after(self, slot: datetime) -> datetime | None:
        """The slot that follows ``slot``."""
        if self.every_seconds is not None:
            return self.first_at_or_after(slot + timedelta(seconds=self.every_seconds))
        return self.first_at_or_after(slot + _STEP)

    def last_before(self, moment: datetime, floor: datetime) -> datetime | None:
        """The last slot strictly before ``moment`` and at or after ``floor``, if any."""
        if moment <= floor:
            return None
        slot: datetime | None
        if self.every_seconds is not None:
            period = timedelta(seconds=self.every_seconds)
            steps = (moment - self.start_at - timedelta(microseconds=1)) // period
            slot = self.start_at + steps * period
        else:
            assert self.cron is not None
            zone = zoneinfo.ZoneInfo(self.timezone)
            found = next(CronSim(self.cron, moment.astimezone(zone), reverse=True), None)
            slot = None if found is None else found.astimezone(UTC)
        if slot is None or slot < floor or slot < self.start_at:
            return None
        if self.end_at is not None and slot > self.end_at:
            return None
        return slot


def cadence_problem(
    cron: str | None, every_seconds: int | None, timezone: str
) -> CadenceProblem | None:
    """Why this cadence cannot be used (a message a person understands), or None."""
    if (cron is None) == (every_seconds is None):
        return CadenceProblem("give exactly one of cron and every_seconds", "cron")
    try:
        zone = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return CadenceProblem(
            f"timezone {timezone!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)",
            "timezone",
        )
    if every_seconds is not None:
        if not MIN_EVERY_SECONDS <= every_seconds <= MAX_EVERY_SECONDS:
            return CadenceProblem(
                f"every_seconds must be from {MIN_EVERY_SECONDS} to {MAX_EVERY_SECONDS}",
                "every_seconds",
            )
        return None
    assert cron is not None
    if len(cron) > MAX_CRON_LENGTH or len(cron.split()) != 5:
        return CadenceProblem(
            "cron takes five fields: minute hour day-of-month month day-of-week", "cron"
        )
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=zone))
    except CronSimError as exc:
        return CadenceProblem(f"cron {cron!r} is not valid: {exc}", "cron")
    return None


@dataclass(frozen=True)
class Plan:
    """What one pass does with a schedule: the slots to fire (oldest first), how many it
    skipped, and the cursor after it (None: the schedule has no slot left)."""

    fire: tuple[datetime, ...]
    skipped: int
    next_slot_at: datetime | None


def due_slots(
    cadence: Cadence,
    cursor: datetime,
    now: datetime,
    catch_up: CatchUp,
    *,
    grace: timedelta,
    limit: int,
) -> Plan:
    """The slots a pass at ``now`` fires from ``cursor`` (the first slot not yet decided)."""
    if cursor > now:
        return Plan((), 0, cursor)
    on_time_from = now - grace
    missed: list[datetime] = []
    skipped = 0
    if cursor < on_time_from:
        if catch_up is CatchUp.ALL:
            slot: datetime | None = cadence.first_at_or_after(cursor)
            while slot is not None and slot < on_time_from and len(missed) < limit:
                missed.append(slot)
                slot = cadence.after(slot)
            if slot is not None and slot < on_time_from:  # the limit: the rest next pass
                return Plan(tuple(missed), 0, slot)
        else:
            latest = cadence.last_before(on_time_from, cursor)
            if latest is not None:
                skipped = _count_between(cadence, cursor, latest)
                if catch_up is CatchUp.ONE:
                    missed.append(latest)
                else:
                    skipped = min(MAX_COUNTED, skipped + 1)
    fire = missed
    slot = cadence.first_at_or_after(max(cursor, on_time_from))
    while slot is not None and slot <= now and len(fire) < limit:
        fire.append(slot)
        slot = cadence.after(slot)
    return Plan(tuple(fire), skipped, slot)


# Skipped slots are counted up to this many (for the log); more are reported as this.
MAX_COUNTED = 10_000


def _count_between(cadence: Cadence, first: datetime, last: datetime) -> int:
    """How many slots fall in ``[first, last)`` (capped at ``MAX_COUNTED``)."""
    if cadence.every_seconds is not None:
        return min(MAX_COUNTED, int((last - first).total_seconds()) // cadence.every_seconds)
    count = 0
    slot: datetime | None = first
    while slot is not None and slot < last and count < MAX_COUNTED:
        count += 1
        slot = cadence.after(slot)
    return count
