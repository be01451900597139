"""What one attempt consumed, and the rules for reading and reporting it (no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum

# The longest window one usage report covers, in days.
MAX_REPORT_DAYS = 400


class GroupBy(StrEnum):
    """How a usage report sums its records."""

    TOOL = "tool"
    DAY = "day"
    TENANT = "tenant"


@dataclass(frozen=True)
class AttemptUsage:
    """What one attempt's container consumed, as read from the engine when it ended."""

    cpu_seconds: float
    memory_peak_bytes: int
    memory_avg_bytes: int
    wall_seconds: float
    disk_bytes: int = 0
    # None: the tool had no network (``network_mode=none``), or it could not be read.
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None


@dataclass(frozen=True)
class Counters:
    """Raw counters of a container as its engine or its cgroup gives them."""

    cpu_ns: int | None = None
    memory_peak_bytes: int | None = None
    # Memory samples taken while it ran: their sum and how many (an average without a list).
    memory_sum: int = 0
    memory_samples: int = 0
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None


def add_sample(counters: Counters, memory: int | None) -> Counters:
    """``counters`` with one more memory sample: in the sum, and under the peak."""
    if memory is None or memory < 0:
        return counters
    return replace(
        counters,
        memory_peak_bytes=max(counters.memory_peak_bytes or 0, memory),
        memory_sum=counters.memory_sum + memory,
        memory_samples=counters.memory_samples + 1,
    )


def _whole(value: int | float | None) -> int:
    """A byte count as stored: whole, never negative, zero when unknown."""
    if value is None or not math.isfinite(value):
        return 0
    return max(int(value), 0)


def usage_of(
    counters: Counters,
    *,
    started_at: datetime | None,
    finished_at: datetime | None,
    disk_bytes: int | None = None,
) -> AttemptUsage:
    """An attempt's usage from its counters: CPU from nanoseconds, the average of the memory
    samples, never above the peak (the peak when none was taken: a run shorter than one
    sample), wall time from the container's own start and finish."""
    peak = _whole(counters.memory_peak_bytes)
    samples = counters.memory_samples
    average = _whole(counters.memory_sum / samples) if samples > 0 else peak
    wall = 0.0
    if started_at is not None and finished_at is not None:
        wall = max((finished_at - started_at).total_seconds(), 0.0)
    return AttemptUsage(
        cpu_seconds=_whole(counters.cpu_ns) / 1e9,
        memory_peak_bytes=peak,
        memory_avg_bytes=min(average, peak),
        wall_seconds=wall,
        disk_bytes=_whole(disk_bytes),
        net_rx_bytes=None if counters.net_rx_bytes is None else _whole(counters.net_rx_bytes),
        net_tx_bytes=None if counters.net_tx_bytes is None else _whole(counters.net_tx_bytes),
    )


@dataclass(frozen=True)
class BuildUsage:
    """What the steps of one image build consumed, as far as its engine lets it be read:
    None where it could not be (only the wall time, from the database, is always known)."""

    cpu_seconds: float | None = None
    memory_peak_bytes: int | None = None


def build_usage_of(counters: Counters) -> BuildUsage:
    """A build's usage from its parent cgroup's counters (None: not measured)."""
    cpu, peak = counters.cpu_ns, counters.memory_peak_bytes
    return BuildUsage(
        cpu_seconds=None if cpu is None else _whole(cpu) / 1e9,
        memory_peak_bytes=None if peak is None else _whole(peak),
    )


class WindowError(ValueError):
    """A report window a person asked for that cannot be answered."""


@dataclass(frozen=True)
class Window:
    """A report's half-open time window ``[start, end)``, in UTC."""

    start: datetime
    end: datetime


def report_window(first: date | None, last: date | None, today: date) -> Window:
    """``from`` and ``to`` as whole UTC days, both included; by default the current month
    up to today. Refused: ``to`` before ``from``, or more than MAX_REPORT_DAYS days."""
    last = last or today
    first = first or last.replace(day=1)
    if last < first:
        raise WindowError(f"'to' ({last}) is before 'from' ({first})")
    if (last - first).days + 1 > MAX_REPORT_DAYS:
        raise WindowError(f"a report covers at most {MAX_REPORT_DAYS} days")
    start = datetime.combine(first, time(), tzinfo=UTC)
    return Window(start=start, end=datetime.combine(last, time(), tzinfo=UTC) + timedelta(days=1))


def day_start(now: datetime) -> datetime:
    """The start of ``now``'s UTC day: when a daily quota starts over."""
    return datetime.combine(now.astimezone(UTC).date(), time(), tzinfo=UTC)


def quota_spent(spent_cpu_seconds: float, quota_cpu_seconds: float) -> bool:
    """Whether a daily CPU quota (0: none) is used up by what was spent today."""
    return quota_cpu_seconds > 0 and spent_cpu_seconds >= quota_cpu_seconds


def seconds_to_day_end(now: datetime) -> int:
    """Whole seconds (at least 1) until the next UTC midnight: when a spent quota renews."""
    left = (day_start(now) + timedelta(days=1) - now).total_seconds()
    return max(1, math.ceil(left))
