"""The dashboard's templates and the filters they use (times, durations, JSON, labels)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from api.ui.batch_graph import natural_key, ref_anchor, ref_link
from runyard.platform.models import ToolRunEvent

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"

EVENT_LABELS = {
    "claimed": "Claimed",
    "adopted": "Adopted by another worker",
    "lease_expired": "Heartbeat lost (lease expired)",
    "requeued": "Requeued",
    "released": "Released (worker handed over)",
    "cancel_requested": "Cancel requested",
    "status": "Status",
    "webhook": "Webhook delivery",
}


def relative(moment: datetime, now: datetime | None = None) -> str:
    """``"3 min ago"`` / ``"in 5 s"``."""
    seconds = ((now or datetime.now(UTC)) - moment).total_seconds()
    future, seconds = seconds < 0, abs(seconds)
    if seconds < 60:
        amount = f"{int(seconds)} s"
    elif seconds < 3600:
        amount = f"{int(seconds // 60)} min"
    elif seconds < 86_400:
        amount = f"{int(seconds // 3600)} h"
    else:
        amount = f"{int(seconds // 86_400)} d"
    return f"in {amount}" if future else f"{amount} ago"


def absolute(moment: datetime) -> str:
    """UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def when(moment: datetime | None) -> Markup:
    """A ``<time>``: absolute text, then the relative age (kept fresh by app.js)."""
    if moment is None:
        return Markup('<span class="muted">—</span>')
    iso = moment.astimezone(UTC).isoformat()
    return Markup(
        f'<time datetime="{escape(iso)}">{escape(absolute(moment))}</time> '
        f'<span class="rel" data-since="{escape(iso)}">({escape(relative(moment))})</span>'
    )


def when_live(moment: datetime | None) -> Markup:
    """``when`` with the relative age left to app.js: a fragment that is re-fetched and
    compared (the batch page's) then stays the same while nothing but the clock moved."""
    if moment is None:
        return when(None)
    iso = moment.astimezone(UTC).isoformat()
    return Markup(
        f'<time datetime="{escape(iso)}">{escape(absolute(moment))}</time> '
        f'<span class="rel" data-since="{escape(iso)}"></span>'
    )


def duration(start: datetime | None, end: datetime | None) -> str:
    """``"1.24 s"``, ``"3 min 5 s"``, or a dash when a bound is missing."""
    if start is None or end is None:
        return "—"
    seconds = (end - start).total_seconds()
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def seconds(value: float | None) -> str:
    """A wait time for the queue page."""
    if value is None:
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def pretty_json(value: Any) -> str:
    """Indented JSON for a ``<pre>``."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def event_label(event: ToolRunEvent) -> str:
    """What happened, in words."""
    data = event.data or {}
    label = EVENT_LABELS.get(event.type, event.type.replace("_", " ").capitalize())
    if event.type == "status" and "status" in data:
        label = f"Status: {data['status']}"
    if event.type == "egress":
        verdict = "allowed" if data.get("allowed") else "refused"
        label = f"Egress {verdict}: {data.get('host')}:{data.get('port')}"
    return label


# Only these fields of an event are shown: never an engine or API process id, a container,
# or whatever a later statement adds to an event's data.
EVENT_DETAILS = (
    "attempt",
    "worker_id",
    "exit_code",
    "error_code",
    "available_at",
    "unstarted",
    "outcome",
    "status_code",
    "error",
    # An egress connection's (the host and port are in its label).
    "reason",
    "bytes_out",
    "bytes_in",
)


def event_details(event: ToolRunEvent) -> str:
    """The event's shown fields as ``name: value`` pairs (attempt, worker, error ...)."""
    data = event.data or {}
    parts = [
        f"{key.replace('_', ' ')}: {data[key]}"
        for key in EVENT_DETAILS
        if data.get(key) is not None
    ]
    return ", ".join(parts)


def make_templates() -> Jinja2Templates:
    """The template set with its filters; autoescaping is on for every page."""
    templates = Jinja2Templates(directory=TEMPLATES_DIR)
    env = templates.env
    env.filters.update(
        when=when,
        when_live=when_live,
        natural_sort=lambda names: sorted(names, key=natural_key),
        duration=duration,
        seconds=seconds,
        pretty_json=pretty_json,
        event_label=event_label,
        event_details=event_details,
    )
    env.globals.update(absolute=absolute, ref_anchor=ref_anchor, ref_link=ref_link)
    return templates
