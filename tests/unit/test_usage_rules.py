"""The usage rules: an attempt's figures from raw counters, report windows, the daily quota."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from runyard.domain.usage import (
    MAX_REPORT_DAYS,
    Counters,
    WindowError,
    add_sample,
    day_start,
    quota_spent,
    report_window,
    seconds_to_day_end,
    usage_of,
)

T0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("counters", "cpu", "peak", "average"),
    [
        # Nanoseconds to seconds; the average of the samples.
        (
            Counters(cpu_ns=2_000_000_000, memory_peak_bytes=300, memory_sum=400, memory_samples=2),
            2.0,
            300,
            200,
        ),
        # No sample taken (a run shorter than one): the average is the peak.
        (Counters(cpu_ns=5, memory_peak_bytes=100), 5e-9, 100, 100),
        # An average above the peak (samples of a fallback that knows no peak) is capped.
        (Counters(memory_peak_bytes=10, memory_sum=90, memory_samples=3), 0.0, 10, 10),
        # Nothing known: zeros, never negative.
        (Counters(cpu_ns=-4, memory_peak_bytes=None), 0.0, 0, 0),
    ],
)
def test_usage_of__figures_from_counters(counters: Counters, cpu: float, peak: int, average: int):
    usage = usage_of(counters, started_at=T0, finished_at=T0 + timedelta(seconds=3))
    assert usage.cpu_seconds == pytest.approx(cpu)
    assert (usage.memory_peak_bytes, usage.memory_avg_bytes) == (peak, average)
    assert usage.wall_seconds == 3.0


@pytest.mark.parametrize(
    ("started", "finished", "wall"),
    [(T0, T0 + timedelta(seconds=1.5), 1.5), (T0, T0 - timedelta(seconds=1), 0.0), (None, T0, 0.0)],
)
def test_usage_of__wall_time_is_never_negative_or_guessed(
    started: datetime | None, finished: datetime, wall: float
):
    assert usage_of(Counters(), started_at=started, finished_at=finished).wall_seconds == wall


def test_usage_of__network_only_where_measured():
    bare = usage_of(Counters(), started_at=None, finished_at=None, disk_bytes=None)
    assert (bare.net_rx_bytes, bare.net_tx_bytes, bare.disk_bytes) == (None, None, 0)
    networked = usage_of(
        Counters(net_rx_bytes=10, net_tx_bytes=-1), started_at=None, finished_at=None
    )
    assert (networked.net_rx_bytes, networked.net_tx_bytes) == (10, 0)


def test_add_sample__sums_and_raises_the_peak():
    counters = add_sample(add_sample(Counters(memory_peak_bytes=50), 80), 20)
    assert (counters.memory_peak_bytes, counters.memory_sum, counters.memory_samples) == (
        80,
        100,
        2,
    )
    assert add_sample(counters, None) == counters
    assert add_sample(counters, -1) == counters


@pytest.mark.parametrize(
    ("first", "last", "start", "end"),
    [
        # Defaults: this month up to today, whole days, both ends included.
        (None, None, date(2026, 11, 1), date(2026, 11, 28)),
        (date(2026, 1, 5), date(2026, 1, 5), date(2026, 1, 5), date(2026, 1, 6)),
        (None, date(2026, 3, 10), date(2026, 3, 1), date(2026, 3, 11)),
    ],
)
def test_report_window__whole_utc_days(
    first: date | None, last: date | None, start: date, end: date
):
    window = report_window(first, last, today=date(2026, 11, 27))
    assert window.start == datetime(start.year, start.month, start.day, tzinfo=UTC)
    assert window.end == datetime(end.year, end.month, end.day, tzinfo=UTC)


@pytest.mark.parametrize(
    ("first", "last", "message"),
    [
        (date(2026, 2, 2), date(2026, 2, 1), "is before"),
        (date(2024, 1, 1), date(2026, 1, 1), f"at most {MAX_REPORT_DAYS} days"),
    ],
)
def test_report_window__refuses_what_cannot_be_answered(first: date, last: date, message: str):
    with pytest.raises(WindowError, match=message):
        report_window(first, last, today=date(2026, 11, 27))


def test_day_start__midnight_utc_of_any_zone():
    evening = datetime(2026, 11, 27, 23, 30, tzinfo=UTC).astimezone(ZoneInfo("Asia/Tokyo"))
    assert day_start(evening) == datetime(2026, 11, 27, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spent", "quota", "refused"),
    [(0.0, 0.0, False), (1e9, 0.0, False), (9.9, 10.0, False), (10.0, 10.0, True), (11, 10, True)],
)
def test_quota_spent__zero_is_no_quota(spent: float, quota: float, refused: bool):
    assert quota_spent(spent, quota) is refused


@pytest.mark.parametrize(
    ("now", "left"),
    [
        (datetime(2026, 11, 27, 0, 0, tzinfo=UTC), 86400),
        (datetime(2026, 11, 27, 23, 59, 59, 500000, tzinfo=UTC), 1),
        (datetime(2026, 11, 27, 12, 0, tzinfo=UTC), 43200),
    ],
)
def test_seconds_to_day_end__at_least_one(now: datetime, left: int):
    assert seconds_to_day_end(now) == left
