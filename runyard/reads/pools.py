"""Worker pools: which queues have live workers (metrics, the dashboard)."""

from __future__ import annotations

from sqlalchemy import Connection, text

# Workers seen within ``:live`` seconds and not stopped, per queue they serve.
LIVE_WORKERS_BY_QUEUE = text(
    """
    SELECT q.name AS queue, count(*) AS workers
    FROM workers w CROSS JOIN LATERAL unnest(w.queues) AS q(name)
    WHERE w.stopped_at IS NULL AND w.last_seen_at > now() - make_interval(secs => :live)
    GROUP BY q.name ORDER BY q.name
    """
)


def live_workers_by_queue(conn: Connection, live_seconds: float) -> dict[str, int]:
    """Live workers per queue they serve; a queue no live worker serves is absent."""
    rows = conn.execute(LIVE_WORKERS_BY_QUEUE, {"live": live_seconds}).all()
    return {row.queue: int(row.workers) for row in rows}


def unserved_queues(queues: list[str], live: dict[str, int]) -> list[str]:
    """The queues of ``queues`` that no live worker serves, in order."""
    return [queue for queue in queues if live.get(queue, 0) == 0]
