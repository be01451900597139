"""Server-rendered SVG charts of a queue's last hour: no script, no external asset, colours
from app.css (the page's Content-Security-Policy allows nothing else)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

from runyard.reads.dashboard import QueueActivity, QueueMinute

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 48, 10, 12, 28
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


@dataclass(frozen=True)
class QueueCharts:
    """One queue's two charts, ready for the page."""

    queue: str
    counts: Markup
    waits: Markup


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 times 10^k at or above ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def _hhmm(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%H:%M")


def _y(value: float, top: float) -> float:
    return TOP + PLOT_H * (1 - value / top)


def _frame(
    chart_id: str,
    title: str,
    summary: str,
    minutes: Sequence[QueueMinute],
    top: float,
    label: Callable[[float], str],
    body: list[str],
) -> Markup:
    """Axes, grid, labels and ``body`` in one accessible ``<svg>``."""
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{chart_id}-t {chart_id}-d" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{chart_id}-t">{escape(title)}</title>',
        f'<desc id="{chart_id}-d">{escape(summary)}</desc>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = _y(top * fraction, top)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(label(top * fraction))}</text>"
        )
    if minutes:
        ticks = [(0, "start"), (len(minutes) // 2, "middle"), (len(minutes) - 1, "end")]
        for index, anchor in ticks:
            x = LEFT + PLOT_W * (index + 0.5) / len(minutes)
            parts.append(
                f'<text class="axis" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">'
                f"{_hhmm(minutes[index].minute)}{' UTC' if anchor == 'end' else ''}</text>"
            )
    parts.extend(body)
    parts.append("</svg>")
    return Markup("".join(parts))


# The finished bar's segments, bottom up, with the class that colours each (app.css).
OUTCOMES: tuple[tuple[str, Callable[[QueueMinute], int]], ...] = (
    ("succeeded", lambda m: m.succeeded),
    ("failed", lambda m: m.failed),
    ("cancelled", lambda m: m.cancelled),
)


def counts_chart(activity: QueueActivity, chart_id: str) -> Markup:
    """Runs started per minute beside runs finished, the finished bar split into those that
    succeeded, failed (or timed out) and were cancelled."""
    minutes = activity.minutes
    started = sum(m.started for m in minutes)
    finished = sum(m.finished for m in minutes)
    top = nice_ceiling(max([m.started for m in minutes] + [m.finished for m in minutes] + [1]))
    slot = PLOT_W / max(1, len(minutes))
    body = []

    def bar(x: float, low: float, value: int, css: str, words: str) -> None:
        y_top, y_low = _y(low + value, top), _y(low, top)
        body.append(
            f'<rect class="bar {css}" x="{x:.1f}" y="{y_top:.1f}" '
            f'width="{slot * 0.4:.1f}" height="{y_low - y_top:.1f}">'
            f"<title>{words}</title></rect>"
        )

    for index, minute in enumerate(minutes):
        x = LEFT + index * slot
        when = f"{_hhmm(minute.minute)} UTC"
        if minute.started:
            bar(x + slot * 0.1, 0, minute.started, "started", f"{when}: {minute.started} started")
        low = 0
        for css, pick in OUTCOMES:
            value = pick(minute)
            if value:
                words = f"{when}: {value} {css} (of {minute.finished} finished)"
                bar(x + slot * 0.5, low, value, css, words)
                low += value
    failed = sum(m.failed for m in minutes)
    cancelled = sum(m.cancelled for m in minutes)
    title = f"Runs started and finished per minute, queue {activity.queue}"
    summary = (
        f"{started} started and {finished} finished ({finished - failed - cancelled} succeeded,"
        f" {failed} failed or timed out, {cancelled} cancelled) in the last {len(minutes)} minutes"
    )
    return _frame(chart_id, title, summary, minutes, top, lambda v: f"{v:g}", body)


def _seconds(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:g} s"


def waits_chart(activity: QueueActivity, chart_id: str) -> Markup:
    """Wait from request to start of the runs started each minute: p50 and p95 lines,
    broken where no run started."""
    minutes = activity.minutes
    waits = [m.wait_p95 for m in minutes if m.wait_p95 is not None]
    top = nice_ceiling(max(waits, default=0.0))
    slot = PLOT_W / max(1, len(minutes))
    lines: list[str] = []
    dots: list[str] = []
    picks: list[tuple[str, Callable[[QueueMinute], float | None]]] = [
        ("p95", lambda m: m.wait_p95),
        ("p50", lambda m: m.wait_p50),
    ]
    for css, pick in picks:
        segment: list[str] = []
        segments = [segment]
        for index, minute in enumerate(minutes):
            value = pick(minute)
            if value is None:
                segment = []
                segments.append(segment)
                continue
            x, y = LEFT + slot * (index + 0.5), _y(value, top)
            segment.append(f"{x:.1f},{y:.1f}")
            dots.append(
                f'<circle class="dot {css}" cx="{x:.1f}" cy="{y:.1f}" r="2.5">'
                f"<title>{_hhmm(minute.minute)} UTC: {css} {_seconds(value)}</title></circle>"
            )
        lines.extend(
            f'<polyline class="line {css}" points="{" ".join(points)}"/>'
            for points in segments
            if len(points) > 1
        )
    title = f"Wait from request to start per minute (p50, p95), queue {activity.queue}"
    summary = (
        f"highest p95 {_seconds(max(waits))} in the last {len(minutes)} minutes"
        if waits
        else f"no run started in the last {len(minutes)} minutes"
    )
    return _frame(chart_id, title, summary, minutes, top, _seconds, lines + dots)
