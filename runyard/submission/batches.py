"""Batches: many runs submitted as one graph, read, cancelled and retried as one.

Writes go through ``runyard.queue.graph``; the reads here are plain. A batch shows the
latest run of each ref: a retry's run takes the place of the run it re-runs.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

from runyard.domain.graph import ACTIVE, GraphProblem, Node, batch_status, summarized
from runyard.platform.db import autocommit
from runyard.platform.tracing import TraceContext, tracing
from runyard.queue import AdmissionCaps, AdmissionRefused, ApiQueue
from runyard.queue.graph import GraphResult, GraphRun, GraphSubmit, GraphWriter
from runyard.reads.metrics import Metrics
from runyard.registry.tools import ToolRegistry
from runyard.submission.quota import DailyQuota
from runyard.submission.request import RunRequest
from runyard.submission.results import submission_result
from runyard.traces.context import with_trace


class BatchItemProblem(Exception):
    """Item ``index`` of a batch was refused; ``cause`` says why (unknown tool, bad input)."""

    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(str(cause))
        self.index = index
        self.cause = cause


class BatchNotFinished(Exception):
    """A retry asked of a batch that still has runs queued or running."""


class TooManyDependencies(GraphProblem):
    """A batch names more dependencies in all than a batch may hold."""

    def __init__(self, message: str) -> None:
        super().__init__(message, None, field="runs")


@dataclass(frozen=True)
class BatchItem:
    """One run of a batch request: its ref and the request (``depends_on`` names refs of
    the batch or ids of existing runs)."""

    ref: str
    request: RunRequest


@dataclass(frozen=True)
class BatchRun:
    """A run of a batch as the batch shows it."""

    ref: str
    run_id: uuid.UUID
    tool: str
    status: str
    error_code: str | None
    depends_on: tuple[str, ...]  # refs of the batch, or ids of runs outside it
    rerun_of: uuid.UUID | None
    requested_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class BatchView:
    """A batch: its status, the count of its runs by status, and its runs by ref."""

    id: uuid.UUID
    status: str
    created_at: datetime
    size: int
    counts: dict[str, int]
    runs: list[BatchRun]


@dataclass(frozen=True)
class ListedBatch:
    """A batch as a page of batches shows it: its status and the count of its runs (the
    latest of each ref) by status; its runs and their dependencies are on its own page."""

    id: uuid.UUID
    status: str
    created_at: datetime
    size: int
    counts: dict[str, int]


def dependencies_problem(dependencies: int, cap: int) -> str | None:
    """Why a batch of ``dependencies`` depends_on entries in all is refused (``cap`` 0: no
    cap), or None."""
    if cap <= 0 or dependencies <= cap:
        return None
    return (
        f"the batch names {dependencies} dependencies in all (depends_on entries of its"
        f" runs); a batch may hold at most {cap}"
    )


def written_view(
    batch_id: uuid.UUID, runs: Sequence[GraphRun], result: GraphResult, at: datetime
) -> BatchView:
    """A new batch as ``result`` wrote it: queued runs, or failed at once (a dependency had
    ended without success), by ref in code point order as ``Batches.view`` lists them."""
    ids = set(result.run_ids)
    written = [
        BatchRun(
            ref=item.node.ref or "",
            run_id=run_id,
            tool=item.run.tool,
            status="failed" if failed else "queued",
            error_code="dependency_failed" if failed else None,
            depends_on=tuple(
                ref if dep in ids and ref is not None else str(dep) for ref, dep in deps
            ),
            rerun_of=None,
            requested_at=at,
            finished_at=at if failed else None,
        )
        for item, run_id, failed, deps in zip(
            runs, result.run_ids, result.failed, result.dependencies, strict=True
        )
    ]
    written.sort(key=lambda run: run.ref)
    return BatchView(
        id=batch_id,
        status=batch_status([(run.status, run.error_code) for run in written]),
        created_at=at,
        size=len(written),
        counts=dict(Counter(run.status for run in written)),
        runs=written,
    )


BATCH = text("SELECT id, tenant, created_at, size FROM batches WHERE id = :id")

# The latest run of each ref of the batches ``:ids``, by ref in code point order (the order of
# Python's ``sorted``, so the answer of a submit, built without reading, lists them the same).
LATEST_RUNS = text(
    """
    SELECT DISTINCT ON (r.batch_id, r.ref COLLATE "C") r.batch_id, r.id, r.ref, r.tool,
           CAST(r.status AS text) AS status, r.error_code, r.rerun_of, r.requested_at,
           r.finished_at, r.input, r.callback_url, r.spec, j.priority
    FROM tool_runs r LEFT JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE r.batch_id = ANY(CAST(:ids AS uuid[]))
    ORDER BY r.batch_id, r.ref COLLATE "C", r.requested_at DESC, r.id DESC
    """
)

# The status of the latest run of each ref of the batch ``:id`` and whether a dependency failed
# it (what ``batch_status`` needs), counted: what a waiter re-reads, no run's input or spec.
BATCH_STATE = text(
    """
    WITH latest AS (
        SELECT DISTINCT ON (r.ref) CAST(r.status AS text) AS status,
               r.error_code IS NOT DISTINCT FROM 'dependency_failed' AS dependency_failed
        FROM tool_runs r
        WHERE r.batch_id = :id
        ORDER BY r.ref, r.requested_at DESC, r.id DESC
    )
    SELECT status, dependency_failed, count(*) AS runs
    FROM latest GROUP BY status, dependency_failed
    """
)

# The dependencies of the runs ``:ids``, and whether each is of the dependent's own batch; by
# ref in code point order (a run without one last), then by id.
EDGES = text(
    """
    SELECT d.run_id, d.depends_on, p.ref, p.batch_id IS NOT DISTINCT FROM c.batch_id AS same_batch
    FROM tool_run_deps d
    JOIN tool_runs p ON p.id = d.depends_on
    JOIN tool_runs c ON c.id = d.run_id
    WHERE d.run_id = ANY(CAST(:ids AS uuid[]))
    ORDER BY d.run_id, p.ref COLLATE "C", d.depends_on
    """
)

# A page of the tenant's batches, newest first after the keyset position, each with the count
# of its latest runs by status and whether a failure was its dependency's (what
# ``batch_status`` needs): at most a row per batch and status, never a run nor an edge.
BATCH_PAGE = text(
    """
    WITH page AS MATERIALIZED (
        SELECT b.id, b.created_at, b.size
        FROM batches b
        WHERE b.tenant = :tenant
          AND (CAST(:before AS timestamptz) IS NULL
               OR (b.created_at, b.id) < (CAST(:before AS timestamptz), CAST(:before_id AS uuid)))
        ORDER BY b.created_at DESC, b.id DESC
        LIMIT :limit
    ), latest AS (
        SELECT DISTINCT ON (r.batch_id, r.ref) r.batch_id, CAST(r.status AS text) AS status,
               r.error_code IS NOT DISTINCT FROM 'dependency_failed' AS dependency_failed
        FROM tool_runs r
        WHERE r.batch_id IN (SELECT id FROM page)
        ORDER BY r.batch_id, r.ref, r.requested_at DESC, r.id DESC
    )
    SELECT p.id, p.created_at, p.size, l.status, l.dependency_failed, count(l.status) AS runs
    FROM page p LEFT JOIN latest l ON l.batch_id = p.id
    GROUP BY p.id, p.created_at, p.size, l.status, l.dependency_failed
    ORDER BY p.created_at DESC, p.id DESC, l.status
    """
)


def listed_batches(rows: Sequence[Any]) -> list[ListedBatch]:
    """The batches of ``BATCH_PAGE``'s rows, in their order."""
    groups: dict[uuid.UUID, list[Any]] = {}
    for row in rows:
        groups.setdefault(row.id, []).append(row)
    listed = []
    for batch_rows in groups.values():
        status, counts = summarized(batch_rows)
        first = batch_rows[0]
        listed.append(
            ListedBatch(
                id=first.id,
                status=status,
                created_at=first.created_at,
                size=first.size,
                counts=counts,
            )
        )
    return listed


class Batches:
    """The batch use cases over the graph writer, the registry and the admission caps."""

    def __init__(
        self,
        queue: ApiQueue,
        registry: ToolRegistry,
        caps: AdmissionCaps,
        *,
        queue_mode: bool = True,
        metrics: Metrics | None = None,
        quota: DailyQuota | None = None,
    ) -> None:
        self._queue = queue
        self._quota = quota
        self._metrics = metrics or Metrics()
        self._engine: Engine = queue.engine
        self._registry = registry
        self._caps = caps
        self._queue_mode = queue_mode
        self._writer = GraphWriter(queue.engine)

    @property
    def queue_mode(self) -> bool:
        """False in sync mode, where batches are refused."""
        return self._queue_mode

    def submit(
        self, tenant: str, items: Sequence[BatchItem], idempotency_key: str | None
    ) -> GraphResult:
        """Check every item, then write them all or none. Raises ``BatchItemProblem``,
        ``GraphProblem``, ``AdmissionRefused``, ``IdempotencyConflict``."""
        return self.submit_viewed(tenant, items, idempotency_key)[0]

    def submit_viewed(
        self, tenant: str, items: Sequence[BatchItem], idempotency_key: str | None
    ) -> tuple[GraphResult, BatchView]:
        """``submit``, and the batch as written (as a read right after the commit shows it;
        read back for an idempotent replay). Counts its runs by result."""
        try:
            with tracing().span("submit_batch") as span:
                result, view = self._submit_viewed(tenant, items, idempotency_key, span.context())
        except Exception as exc:
            self._count(len(items), submission_result(exc))
            raise
        self._count(len(items), submission_result(None, created=result.created))
        return result, view

    def _count(self, runs: int, result: str) -> None:
        """Count ``runs`` submitted runs (those of a batch, or of its retry) as ``result``."""
        self._metrics.submissions.labels(result=result).inc(runs)

    def _submit_viewed(
        self,
        tenant: str,
        items: Sequence[BatchItem],
        idempotency_key: str | None,
        trace: TraceContext | None = None,
    ) -> tuple[GraphResult, BatchView]:
        dependencies = sum(len(item.request.depends_on) for item in items)
        problem = dependencies_problem(dependencies, self._caps.batch_max_dependencies)
        if problem is not None:
            raise TooManyDependencies(problem)
        runs = []
        for index, item in enumerate(items):
            try:
                run = item.request.prepare(self._registry)
            except Exception as exc:
                raise BatchItemProblem(index, exc) from exc
            if trace is not None:  # the batch's runs are part of its submit's trace
                run = dataclasses.replace(run, spec=with_trace(run.spec, trace))
            node = Node(item.ref, item.request.depends_on)
            runs.append(GraphRun(run, node, run_at=item.request.run_at))
        self._check_room()
        if self._quota is not None:
            self._quota.check(tenant)
        graph = GraphSubmit(tenant, runs, batch=True, idempotency_key=idempotency_key)
        result = self._writer.submit(graph, self._caps)
        assert result.batch_id is not None
        if result.created and result.requested_at is not None:
            return result, written_view(result.batch_id, runs, result, result.requested_at)
        view = self.view(result.batch_id, tenant)
        assert view is not None
        return result, view

    def _check_room(self) -> None:
        if self._queue.queue_full(self._caps.max_queue_depth):
            raise AdmissionRefused("queue_full", self._caps.max_queue_depth)

    def _latest(self, batch_id: uuid.UUID) -> list[Any]:
        return autocommit(self._engine, LATEST_RUNS, {"ids": [batch_id]})

    def _edges(self, runs: Sequence[Any]) -> list[Any]:
        if not runs:
            return []
        return autocommit(self._engine, EDGES, {"ids": [run.id for run in runs]})

    def view(self, batch_id: uuid.UUID, tenant: str | None) -> BatchView | None:
        """The batch if ``tenant`` may see it (None: any tenant)."""
        found = autocommit(self._engine, BATCH, {"id": batch_id})
        if not found or (tenant is not None and found[0].tenant != tenant):
            return None
        return self._views(found)[0]

    def status(self, batch_id: uuid.UUID) -> str:
        """The batch's status alone (one light statement; the caller checked the tenant)."""
        return summarized(autocommit(self._engine, BATCH_STATE, {"id": batch_id}))[0]

    def _views(self, batches: Sequence[Any]) -> list[BatchView]:
        """The read model of ``batches`` (rows with id, created_at, size): two queries, the
        second reading every dependency of their latest runs (a page of one batch only)."""
        latest = autocommit(self._engine, LATEST_RUNS, {"ids": [b.id for b in batches]})
        edges: dict[uuid.UUID, list[str]] = {}
        for edge in self._edges(latest):
            name = edge.ref if edge.same_batch else str(edge.depends_on)
            edges.setdefault(edge.run_id, []).append(name)
        runs: dict[uuid.UUID, list[BatchRun]] = {b.id: [] for b in batches}
        for run in latest:
            runs[run.batch_id].append(
                BatchRun(
                    ref=run.ref,
                    run_id=run.id,
                    tool=run.tool,
                    status=run.status,
                    error_code=run.error_code,
                    depends_on=tuple(edges.get(run.id, ())),
                    rerun_of=run.rerun_of,
                    requested_at=run.requested_at,
                    finished_at=run.finished_at,
                )
            )
        return [
            BatchView(
                id=batch.id,
                status=batch_status([(run.status, run.error_code) for run in runs[batch.id]]),
                created_at=batch.created_at,
                size=batch.size,
                counts=dict(Counter(run.status for run in runs[batch.id])),
                runs=runs[batch.id],
            )
            for batch in batches
        ]

    def page(
        self, tenant: str, *, limit: int, before: tuple[datetime, uuid.UUID] | None = None
    ) -> list[ListedBatch]:
        """The tenant's batches, newest first, after the keyset position ``before``, with
        their counts by status (one statement, whatever the batches hold)."""
        params = {
            "tenant": tenant,
            "limit": limit,
            "before": before[0] if before else None,
            "before_id": before[1] if before else None,
        }
        return listed_batches(autocommit(self._engine, BATCH_PAGE, params))

    def cancel(self, batch_id: uuid.UUID) -> int:
        """Cancel every queued run of the batch and ask running ones to stop."""
        return self._writer.cancel_batch(batch_id)

    def retry(
        self,
        batch_id: uuid.UUID,
        max_priority: int | None,
        allowed_tools: frozenset[str] | None = None,
    ) -> tuple[GraphResult, dict[str, uuid.UUID]]:
        """New runs for every ref whose latest run did not succeed, wired to the latest
        successful runs of the others; the new runs by ref. They are the batch's tenant's,
        whoever asks (an admin's retry too). Raises ``LookupError`` (no such batch),
        ``BatchNotFinished``, ``BatchRetried``, and what a submit raises."""
        found = autocommit(self._engine, BATCH, {"id": batch_id})
        if not found:
            raise LookupError(f"no batch {batch_id}")
        tenant = str(found[0].tenant)
        latest = self._latest(batch_id)
        if any(run.status in ACTIVE for run in latest):
            raise BatchNotFinished("the batch still has runs queued or running")
        again = {run.ref: run for run in latest if run.status != "succeeded"}
        kept = {run.ref: run.id for run in latest if run.status == "succeeded"}
        if not again:
            return GraphResult(batch_id=batch_id, run_ids=[], created=False), {}
        depends: dict[uuid.UUID, list[str]] = {}
        for edge in self._edges(list(again.values())):
            if not edge.same_batch:
                name = str(edge.depends_on)
            elif edge.ref in again:
                name = edge.ref
            else:
                name = str(kept[edge.ref])
            depends.setdefault(edge.run_id, []).append(name)
        runs = []
        for index, (ref, old) in enumerate(again.items()):
            request = RunRequest(
                tenant,
                old.tool,
                old.input,
                old.priority or 0,
                callback_url=old.callback_url,
                max_priority=max_priority,
                allowed_tools=allowed_tools,
                depends_on=tuple(depends.get(old.id, ())),
                rerun_of=old.id,
            )
            try:
                run = request.prepare(self._registry)
            except Exception as exc:
                raise BatchItemProblem(index, exc) from exc
            runs.append(GraphRun(run, Node(ref, request.depends_on)))
        graph = GraphSubmit(
            tenant,
            runs,
            batch=True,
            batch_id=batch_id,
            replaces=tuple(old.id for old in again.values()),
        )
        try:
            self._check_room()
            result = self._writer.submit(graph, self._caps)
        except Exception as exc:
            self._count(len(runs), submission_result(exc))
            raise
        self._count(len(runs), submission_result(None, created=result.created))
        return result, dict(zip(again, result.run_ids, strict=True))
