"""Plain reads behind the dashboard's pages (nothing here writes).

Every statement reads through an index: the job status index for queued and running work,
the per-tenant partial index of active runs, ``started_at`` for wait times and starts per
minute, the partial index of terminal runs by ``finished_at`` for finishes per minute,
``(run_id, xact_id, id)`` for a run's events. A tenant's figures and everyone's are two
statements each, so neither plan has to cope with an optional filter.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, TextClause, func, select, text
from sqlalchemy.orm import Session

from runyard.domain.states import RunStatus
from runyard.platform.models import ToolRunEvent
from runyard.reads.events_sql import LOG_SNAPSHOT
from runyard.reads.runs import EVENT_ORDER, LOG_STREAMS

# Depth counts queued (ready or waiting out a retry backoff) and running jobs only.
DEPTH_ALL = text(
    """
    SELECT queue, CAST(status AS text) AS status,
           (status = 'queued' AND available_at > now()) AS delayed, count(*) AS runs
    FROM tool_run_jobs WHERE status IN ('queued', 'running')
    GROUP BY 1, 2, 3 ORDER BY 1, 2 DESC, 3
    """
)
DEPTH_OF_TENANT = text(
    """
    SELECT j.queue, CAST(j.status AS text) AS status,
           (j.status = 'queued' AND j.available_at > now()) AS delayed, count(*) AS runs
    FROM tool_runs r JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE r.tenant = :tenant AND r.status IN ('queued', 'running')
      AND j.status IN ('queued', 'running')
    GROUP BY 1, 2, 3 ORDER BY 1, 2 DESC, 3
    """
)
OLDEST_READY_ALL = text(
    "SELECT min(available_at) FROM tool_run_jobs WHERE status = 'queued' AND available_at <= now()"
)
OLDEST_READY_OF_TENANT = text(
    """
    SELECT min(j.available_at) FROM tool_runs r JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE r.tenant = :tenant AND r.status = 'queued'
      AND j.status = 'queued' AND j.available_at <= now()
    """
)
_WAITS = """
    SELECT count(*) AS started,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM started_at - requested_at)) AS seconds
    FROM tool_runs
    WHERE started_at >= now() - make_interval(secs => :window) AND mode = 'queue'
"""
WAITS_ALL = text(_WAITS)
WAITS_OF_TENANT = text(_WAITS + " AND tenant = :tenant")
# The charts' window: whole minutes, the last one (now's) still filling.
CHART_WINDOW = text(
    """
    SELECT date_trunc('minute', coalesce(CAST(:now AS timestamptz), now()))
           - make_interval(mins => CAST(:minutes AS integer) - 1)
    """
)
_STARTS = """
    SELECT j.queue, date_trunc('minute', r.started_at) AS minute, count(*) AS started,
           percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (
               ORDER BY extract(epoch FROM r.started_at - r.requested_at)) AS waits
    FROM tool_runs r JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE r.started_at >= :since
      AND r.started_at < :since + make_interval(mins => CAST(:minutes AS integer))
      AND r.mode = 'queue' {tenant}
    GROUP BY 1, 2
"""
STARTS_PER_MINUTE_ALL = text(_STARTS.format(tenant=""))
STARTS_PER_MINUTE_OF_TENANT = text(_STARTS.format(tenant="AND r.tenant = :tenant"))
# The status list matches the partial index of terminal runs by finished_at.
_FINISHES = """
    SELECT j.queue, date_trunc('minute', r.finished_at) AS minute, count(*) AS finished,
           count(*) FILTER (WHERE r.status IN ('failed', 'timed_out')) AS failed,
           count(*) FILTER (WHERE r.status = 'cancelled') AS cancelled
    FROM tool_runs r JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE r.status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
      AND r.finished_at >= :since
      AND r.finished_at < :since + make_interval(mins => CAST(:minutes AS integer))
      AND r.mode = 'queue' {tenant}
    GROUP BY 1, 2
"""
FINISHES_PER_MINUTE_ALL = text(_FINISHES.format(tenant=""))
FINISHES_PER_MINUTE_OF_TENANT = text(_FINISHES.format(tenant="AND r.tenant = :tenant"))
WORKERS = text(
    """
    SELECT w.id, w.engine_id, w.host, w.pid, w.concurrency, w.started_at, w.last_seen_at,
           w.stopped_at, now() AS db_now, coalesce(b.busy, 0) AS busy
    FROM workers w
    LEFT JOIN (SELECT locked_by, count(*) AS busy FROM tool_run_jobs
               WHERE status = 'running' GROUP BY locked_by) b ON b.locked_by = w.id
    WHERE w.stopped_at IS NULL OR w.stopped_at >= now() - make_interval(secs => :keep)
    ORDER BY w.stopped_at IS NOT NULL, w.last_seen_at DESC
    LIMIT 200
    """
)
HOLDER = text(
    """
    SELECT j.locked_by AS owner, j.locked_until AS lease_until
    FROM tool_run_jobs j WHERE j.run_id = :run_id AND j.status = 'running'
      AND j.locked_by IS NOT NULL
    """
)


@dataclass(frozen=True)
class DepthRow:
    """How many runs of one queue are in one state."""

    queue: str
    status: RunStatus
    delayed: bool  # queued, but waiting out a retry backoff
    runs: int


@dataclass(frozen=True)
class QueueOverview:
    """Depth by queue and state, the oldest ready run, and recent wait-time percentiles."""

    depth: list[DepthRow]
    oldest_ready_at: datetime | None
    started_in_window: int
    wait_p50: float | None
    wait_p95: float | None
    wait_p99: float | None
    window_seconds: float


@dataclass(frozen=True)
class QueueMinute:
    """One minute of one queue: runs started and finished (of those, how many failed or
    timed out and how many were cancelled; the rest succeeded), and the started runs' waits."""

    minute: datetime
    started: int = 0
    finished: int = 0
    wait_p50: float | None = None
    wait_p95: float | None = None
    failed: int = 0
    cancelled: int = 0

    @property
    def succeeded(self) -> int:
        """Finished runs that neither failed nor were cancelled."""
        return self.finished - self.failed - self.cancelled


@dataclass(frozen=True)
class QueueActivity:
    """A queue's last minutes, oldest first, one entry per minute (quiet ones too)."""

    queue: str
    minutes: list[QueueMinute]


@dataclass(frozen=True)
class WorkerRow:
    """One worker as the dashboard shows it."""

    id: str
    engine_id: str
    host: str
    pid: int
    slots: int
    busy: int
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    state: str  # "live", "silent" (no heartbeat for a lease) or "stopped"


@dataclass(frozen=True)
class Holder:
    """Who holds a run's current attempt: the worker (or API, for sync runs) and until when."""

    owner: str
    lease_until: datetime | None


@dataclass(frozen=True)
class LogChunk:
    """One stored piece of a stream and when the worker stored it."""

    stream: str
    at: datetime
    text: str


@dataclass(frozen=True)
class LogSnapshot:
    """The live log chunks of ``attempt`` up to event ``upto``; later ones come over SSE."""

    stdout: str
    stderr: str
    upto: int
    attempt: int
    chunks: tuple[LogChunk, ...] = ()


@dataclass(frozen=True)
class Timeline:
    """A run's events other than log chunks, oldest first; the newest ``limit`` of them."""

    events: list[ToolRunEvent]
    omitted: int


def queue_overview(
    engine: Engine, tenant: str | None, *, window_seconds: float = 3600.0
) -> QueueOverview:
    """The queue page's figures, for one tenant or (``None``) all of them."""
    params: dict[str, Any] = {"tenant": tenant, "window": window_seconds}

    def pick(everyone: TextClause, one: TextClause) -> TextClause:
        return everyone if tenant is None else one

    with engine.connect() as conn:
        depth = [
            DepthRow(
                queue=row.queue,
                status=RunStatus(row.status),
                delayed=bool(row.delayed),
                runs=int(row.runs),
            )
            for row in conn.execute(pick(DEPTH_ALL, DEPTH_OF_TENANT), params)
        ]
        oldest = conn.execute(pick(OLDEST_READY_ALL, OLDEST_READY_OF_TENANT), params).scalar_one()
        waits = conn.execute(pick(WAITS_ALL, WAITS_OF_TENANT), params).one()
    p50, p95, p99 = waits.seconds if waits.seconds is not None else (None, None, None)
    return QueueOverview(
        depth=depth,
        oldest_ready_at=oldest,
        started_in_window=int(waits.started),
        wait_p50=p50,
        wait_p95=p95,
        wait_p99=p99,
        window_seconds=window_seconds,
    )


def queue_activity(
    engine: Engine, tenant: str | None, *, minutes: int = 60, now: datetime | None = None
) -> list[QueueActivity]:
    """Per queue with runs started or finished in the last ``minutes``: every minute's
    counts and wait percentiles, for one tenant or (``None``) all of them."""
    params: dict[str, Any] = {"tenant": tenant, "minutes": minutes, "now": now}
    with engine.connect() as conn:
        since = conn.execute(CHART_WINDOW, params).scalar_one()
        params["since"] = since
        starts = conn.execute(
            STARTS_PER_MINUTE_ALL if tenant is None else STARTS_PER_MINUTE_OF_TENANT, params
        ).all()
        finishes = conn.execute(
            FINISHES_PER_MINUTE_ALL if tenant is None else FINISHES_PER_MINUTE_OF_TENANT, params
        ).all()
    return fill_minutes(
        since,
        minutes,
        [(row.queue, row.minute, int(row.started), *(row.waits or (None, None))) for row in starts],
        [
            (row.queue, row.minute, int(row.finished), int(row.failed), int(row.cancelled))
            for row in finishes
        ],
    )


def fill_minutes(
    since: datetime,
    minutes: int,
    starts: list[tuple[str, datetime, int, float | None, float | None]],
    finishes: list[tuple[str, datetime, int, int, int]] | list[tuple[str, datetime, int]],
) -> list[QueueActivity]:
    """The statements' sparse rows as one entry per minute and queue, queues by name."""
    slots = [since + timedelta(minutes=offset) for offset in range(minutes)]
    found: dict[str, dict[datetime, QueueMinute]] = {}
    for queue, minute, started, p50, p95 in starts:
        found.setdefault(queue, {})[minute] = QueueMinute(minute, started, 0, p50, p95)
    for queue, minute, finished, *split in finishes:
        failed, cancelled = split if split else (0, 0)
        row = found.setdefault(queue, {}).get(minute, QueueMinute(minute))
        found[queue][minute] = QueueMinute(
            minute, row.started, finished, row.wait_p50, row.wait_p95, failed, cancelled
        )
    return [
        QueueActivity(queue, [found[queue].get(slot, QueueMinute(slot)) for slot in slots])
        for queue in sorted(found)
    ]


def worker_overview(
    engine: Engine, *, silent_after_seconds: float, keep_stopped_seconds: float = 86_400.0
) -> list[WorkerRow]:
    """Live workers, then those stopped in the last ``keep_stopped_seconds``."""
    with engine.connect() as conn:
        rows = conn.execute(WORKERS, {"keep": keep_stopped_seconds}).all()
    silent_after = timedelta(seconds=silent_after_seconds)
    result = []
    for row in rows:
        if row.stopped_at is not None:
            state = "stopped"
        elif row.db_now - row.last_seen_at > silent_after:
            state = "silent"
        else:
            state = "live"
        result.append(
            WorkerRow(
                id=row.id,
                engine_id=row.engine_id,
                host=row.host,
                pid=row.pid,
                slots=row.concurrency,
                busy=int(row.busy),
                started_at=row.started_at,
                last_seen_at=row.last_seen_at,
                stopped_at=row.stopped_at,
                state=state,
            )
        )
    return result


def run_timeline(engine: Engine, run_id: uuid.UUID, limit: int = 500) -> Timeline:
    """The run's newest ``limit`` non-log events (so the final status is always there)."""
    events = (ToolRunEvent.run_id == run_id, ToolRunEvent.type.not_in(LOG_STREAMS))
    newest = (
        select(ToolRunEvent)
        .where(*events)
        .order_by(*(column.desc() for column in EVENT_ORDER))
        .limit(limit)
    )
    with Session(engine, expire_on_commit=False) as session:
        rows = list(session.scalars(newest))
        omitted = 0
        if len(rows) == limit:
            total = session.scalar(select(func.count()).select_from(ToolRunEvent).where(*events))
            omitted = int(total or 0) - limit
        for row in rows:
            session.expunge(row)
    return Timeline(events=rows[::-1], omitted=omitted)


def log_snapshot(engine: Engine, run_id: uuid.UUID) -> LogSnapshot:
    """The current attempt's live chunks up to the last event a stream may deliver yet
    (LOG_SNAPSHOT): a page that then streams the events after ``upto`` sees no gap and no
    repeat, and an attempt that starts meanwhile arrives whole over the stream."""
    with engine.connect() as conn:
        rows = conn.execute(LOG_SNAPSHOT, {"run_id": run_id}).all()
    out = {stream: "" for stream in LOG_STREAMS}
    chunks = []
    for row in rows:
        if row.type is not None:
            out[row.type] += row.text or ""
            chunks.append(LogChunk(row.type, row.at, row.text or ""))
    first = rows[0] if rows else None
    return LogSnapshot(
        stdout=out["stdout"],
        stderr=out["stderr"],
        upto=int(first.upto or 0) if first else 0,
        attempt=int(first.attempts) if first else 0,
        chunks=tuple(chunks),
    )


def run_holder(engine: Engine, run_id: uuid.UUID) -> Holder | None:
    """The current lease holder of a running run (never its lease token)."""
    with engine.connect() as conn:
        row = conn.execute(HOLDER, {"run_id": run_id}).one_or_none()
    return None if row is None else Holder(owner=row.owner, lease_until=row.lease_until)
