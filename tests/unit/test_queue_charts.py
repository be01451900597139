"""The queue page's charts: minutes filled in, scales, and SVG that stays inside the CSP."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from api.ui.charts import counts_chart, nice_ceiling, waits_chart
from runyard.reads.dashboard import QueueActivity, QueueMinute, fill_minutes

SINCE = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def at(minute: int) -> datetime:
    return SINCE + timedelta(minutes=minute)


def test_fill_minutes__one_entry_per_minute_and_queue():
    activity = fill_minutes(
        SINCE,
        3,
        starts=[("fast", at(0), 2, 0.5, 0.9), ("slow", at(2), 1, 4.0, 4.0)],
        finishes=[("fast", at(0), 1), ("fast", at(1), 3), ("idle", at(2), 1)],
    )
    assert [a.queue for a in activity] == ["fast", "idle", "slow"]
    fast = activity[0].minutes
    assert fast == [
        QueueMinute(at(0), 2, 1, 0.5, 0.9),
        QueueMinute(at(1), 0, 3, None, None),
        QueueMinute(at(2)),
    ]
    assert activity[1].minutes[2] == QueueMinute(at(2), 0, 1)
    assert [m.minute for m in activity[2].minutes] == [at(0), at(1), at(2)]


@pytest.mark.parametrize(
    ("value", "top"), [(0, 1), (0.3, 0.5), (1, 1), (3, 5), (7, 10), (11, 20), (420, 500)]
)
def test_nice_ceiling__table(value: float, top: float):
    assert nice_ceiling(value) == pytest.approx(top)


def _activity(queue: str = "fast") -> QueueActivity:
    minutes = [QueueMinute(at(i)) for i in range(60)]
    minutes[10] = QueueMinute(at(10), 4, 0, 0.2, 1.5)
    minutes[11] = QueueMinute(at(11), 1, 3, 0.4, 0.4, failed=1, cancelled=1)
    minutes[40] = QueueMinute(at(40), 0, 2, None, None)
    minutes[59] = QueueMinute(at(59), 2, 0, 3.0, 7.0)
    return QueueActivity(queue, minutes)


def test_counts_chart__a_bar_per_nonzero_count_with_its_minute():
    root = ET.fromstring(str(counts_chart(_activity(), "c1")))
    bars = root.findall(f"{SVG}rect")
    # Three minutes with starts; finishes: one outcome at 10:40, three stacked at 10:11.
    assert len(bars) == 7
    titles = sorted(str(bar.find(f"{SVG}title").text) for bar in bars)  # type: ignore[union-attr]
    assert "10:10 UTC: 4 started" in titles
    assert "10:40 UTC: 2 succeeded (of 2 finished)" in titles
    stack = [bar for bar in bars if "10:11 UTC" in str(bar.find(f"{SVG}title").text)]  # type: ignore[union-attr]
    assert [bar.get("class") for bar in stack] == [
        "bar started",
        "bar succeeded",
        "bar failed",
        "bar cancelled",
    ]
    # Stacked bottom up: each segment starts where the one below it ends.
    for below, above in itertools.pairwise(stack[1:]):
        assert float(above.get("y") or 0) + float(above.get("height") or 0) == pytest.approx(
            float(below.get("y") or 0), abs=0.1
        )
    assert root.get("aria-labelledby") == "c1-t c1-d"
    assert root.find(f"{SVG}desc").text == (  # type: ignore[union-attr]
        "7 started and 5 finished (3 succeeded, 1 failed or timed out, 1 cancelled)"
        " in the last 60 minutes"
    )
    tallest = max(float(bar.get("height") or 0) for bar in bars)
    assert tallest == pytest.approx(140 * 4 / 5, abs=0.1)  # 4 on a scale of 5


def test_waits_chart__lines_break_where_nothing_started():
    root = ET.fromstring(str(waits_chart(_activity(), "w1")))
    lines = root.findall(f"{SVG}polyline")
    # Minutes 10-11 join into one line per percentile; minute 59 stands alone (a dot).
    assert [line.get("class") for line in lines] == ["line p95", "line p50"]
    assert len(root.findall(f"{SVG}circle")) == 6
    assert root.find(f"{SVG}desc").text == "highest p95 7 s in the last 60 minutes"  # type: ignore[union-attr]


def test_charts__escape_the_queue_name_and_use_nothing_the_csp_forbids():
    hostile = 'q"><script>alert(1)</script>'
    for svg in (counts_chart(_activity(hostile), "a"), waits_chart(_activity(hostile), "b")):
        text = str(svg)
        ET.fromstring(text)  # well-formed
        assert "<script" not in text and "style=" not in text and "href" not in text
        assert "&lt;script&gt;" in text


def test_waits_chart__a_quiet_hour_says_so():
    quiet = QueueActivity("q", [QueueMinute(at(i), 0, 1) for i in range(60)])
    root = ET.fromstring(str(waits_chart(quiet, "w")))
    assert root.findall(f"{SVG}circle") == []
    assert root.find(f"{SVG}desc").text == "no run started in the last 60 minutes"  # type: ignore[union-attr]
