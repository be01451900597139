"""``GET /metrics``: Prometheus text, aggregates only (no tenant, no run ids)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest
from sqlalchemy import text

from api.deps import ServicesDep

router = APIRouter(tags=["health"])

# Only the live states: they sit on the (status, mode) index and stay small.
ACTIVE_RUNS = text(
    """
    SELECT CAST(status AS text) AS status, mode, count(*) AS n FROM tool_runs
    WHERE status IN ('queued', 'running') GROUP BY status, mode
    """
)


@router.get(
    "/metrics",
    operation_id="getMetrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(services: ServicesDep) -> PlainTextResponse:
    """Queued and running runs by mode, sync slots, open event streams, and the series of
    this process's registry (in ``runyard dev``, the worker's and the reaper's too)."""
    with services.engine.connect() as conn:
        rows = conn.execute(ACTIVE_RUNS).all()
    counts = {(row.status, row.mode): int(row.n) for row in rows}
    lines = [
        "# HELP runyard_runs Runs not yet terminal, by status and mode.",
        "# TYPE runyard_runs gauge",
    ]
    for status in ("queued", "running"):
        for mode in ("queue", "sync"):
            value = counts.get((status, mode), 0)
            lines.append(f'runyard_runs{{status="{status}",mode="{mode}"}} {value}')
    sync = services.sync
    lines += [
        "# HELP runyard_sync_slots_busy Inline (sync mode) slots in use.",
        "# TYPE runyard_sync_slots_busy gauge",
        f"runyard_sync_slots_busy {sync.busy if sync is not None else 0}",
        "# HELP runyard_sync_slots Inline (sync mode) slots in all (0: queue mode).",
        "# TYPE runyard_sync_slots gauge",
        f"runyard_sync_slots {sync.max_concurrency if sync is not None else 0}",
        "# HELP runyard_event_streams Open SSE streams of this process.",
        "# TYPE runyard_event_streams gauge",
        f"runyard_event_streams {services.open_streams}",
    ]
    registry_text = generate_latest(services.metrics.registry).decode()
    return PlainTextResponse(
        "\n".join(lines) + "\n" + registry_text,
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )
