"""The dashboard's reads of workflows: a page of batch summaries, which runs are scheduled
(queued with a ``run_at`` still ahead), and the runs a run depends on. Plain reads."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

from runyard.domain.graph import summarized
from runyard.platform.db import autocommit

# The latest run of each ref of a page of batches, counted by status, and whether a failure
# was its dependency's (what ``batch_status`` needs). One statement per scope, so each
# page's keyset is served by an index: (tenant, created_at, id) for a tenant.
_SUMMARIES = """
    WITH page AS (
        SELECT b.id, b.tenant, b.created_at, b.size
        FROM batches b
        WHERE {scope}
          AND (CAST(:before AS timestamptz) IS NULL
               OR (b.created_at, b.id) < (CAST(:before AS timestamptz), CAST(:before_id AS uuid)))
        ORDER BY b.created_at DESC, b.id DESC
        LIMIT :limit
    ), latest AS (
        SELECT DISTINCT ON (r.batch_id, r.ref) r.batch_id, CAST(r.status AS text) AS status,
               coalesce(r.error_code = 'dependency_failed', false) AS dependency_failed
        FROM tool_runs r
        WHERE r.batch_id IN (SELECT id FROM page)
        ORDER BY r.batch_id, r.ref, r.requested_at DESC, r.id DESC
    )
    SELECT p.id, p.tenant, p.created_at, p.size, l.status, l.dependency_failed,
           count(l.status) AS runs
    FROM page p LEFT JOIN latest l ON l.batch_id = p.id
    GROUP BY p.id, p.tenant, p.created_at, p.size, l.status, l.dependency_failed
    ORDER BY p.created_at DESC, p.id DESC, l.status
"""
BATCH_SUMMARIES_OF_TENANT = text(_SUMMARIES.format(scope="b.tenant = :tenant"))
BATCH_SUMMARIES_ALL = text(_SUMMARIES.format(scope="true"))

# Of the given runs, those queued whose run_at is still ahead (``now``: the database clock).
SCHEDULED_RUNS = text(
    """
    SELECT id FROM tool_runs
    WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'queued'
      AND run_at > coalesce(CAST(:now AS timestamptz), now())
    """
)

# The runs a run depends on, as its page names them; ``tenant`` NULL means any tenant.
DEPENDENCIES = text(
    """
    SELECT c.id, c.ref, c.batch_id, CAST(c.status AS text) AS status
    FROM tool_run_deps d JOIN tool_runs c ON c.id = d.depends_on
    WHERE d.run_id = :run_id
      AND (CAST(:tenant AS text) IS NULL OR c.tenant = CAST(:tenant AS text))
    ORDER BY c.batch_id NULLS LAST, c.ref, c.id
    """
)


@dataclass(frozen=True)
class BatchSummary:
    """A row of the batches page."""

    id: uuid.UUID
    tenant: str
    created_at: datetime
    size: int
    status: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> int:
        """Runs (latest of each ref) that have ended."""
        return sum(n for status, n in self.counts.items() if status not in ("queued", "running"))


@dataclass(frozen=True)
class DependencyRow:
    """A run another run depends on: its id, ref and batch (if any) and status."""

    id: uuid.UUID
    ref: str | None
    batch_id: uuid.UUID | None
    status: str


def batch_summaries(
    engine: Engine,
    tenant: str | None,
    *,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None = None,
) -> list[BatchSummary]:
    """Batches newest first after the keyset position ``before`` (tenant None: every
    tenant's), each with its status and the count of its latest runs by status."""
    params = {
        "tenant": tenant,
        "limit": limit,
        "before": before[0] if before else None,
        "before_id": before[1] if before else None,
    }
    statement = BATCH_SUMMARIES_ALL if tenant is None else BATCH_SUMMARIES_OF_TENANT
    groups: dict[uuid.UUID, list[Any]] = {}
    for row in autocommit(engine, statement, params):
        groups.setdefault(row.id, []).append(row)
    summaries = []
    for rows in groups.values():
        status, counts = summarized(rows)
        first = rows[0]
        summaries.append(
            BatchSummary(
                id=first.id,
                tenant=first.tenant,
                created_at=first.created_at,
                size=first.size,
                status=status,
                counts=counts,
            )
        )
    return summaries


def scheduled_runs(
    engine: Engine, run_ids: Sequence[uuid.UUID], now: datetime | None = None
) -> set[uuid.UUID]:
    """Of ``run_ids``, the runs still queued whose ``run_at`` is after ``now``."""
    if not run_ids:
        return set()
    rows = autocommit(engine, SCHEDULED_RUNS, {"ids": list(run_ids), "now": now})
    return {row.id for row in rows}


def dependencies(engine: Engine, run_id: uuid.UUID, tenant: str | None) -> list[DependencyRow]:
    """The runs ``run_id`` depends on that ``tenant`` may see (None: any tenant)."""
    rows = autocommit(engine, DEPENDENCIES, {"run_id": run_id, "tenant": tenant})
    return [
        DependencyRow(id=row.id, ref=row.ref, batch_id=row.batch_id, status=row.status)
        for row in rows
    ]
