"""Graph submits: runs with dependencies or a start time, and batches, written all or none.

One transaction of the statements in ``runyard.queue.graph_sql``; the rules (refs, cycles,
who waits and who is doomed) are the pure functions of ``runyard.domain.graph``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from runyard.domain.graph import Dependency, GraphProblem, Node, Resolved, Start, resolve, starts
from runyard.queue.graph_sql import (
    ADMIT_MANY,
    FIND_BATCH_IDEMPOTENT,
    INSERT_BATCH,
    INSERT_GRAPH,
    LOCK_BATCH_FOR_RETRY,
    LOCK_DEPENDENCIES,
)
from runyard.queue.sql import CANCEL_BATCH
from runyard.queue.values import (
    AdmissionCaps,
    AdmissionRefused,
    IdempotencyConflict,
    NewRun,
    json_digest,
)


class BatchRetried(Exception):
    """A concurrent retry of the same batch wrote its runs first."""


class UnknownDependency(GraphProblem):
    """``depends_on`` names a run that does not exist, or that the caller may not see."""


@dataclass(frozen=True)
class GraphRun:
    """One run of a graph: the checked request, its place in the graph, when it may start."""

    run: NewRun
    node: Node
    run_at: datetime | None = None
    # The schedule that fires it and the slot it fires for (unique together).
    schedule_id: uuid.UUID | None = None
    schedule_slot: datetime | None = None


@dataclass(frozen=True)
class GraphSubmit:
    """A graph to write for one tenant: a batch (``batch=True``) or a single run."""

    tenant: str
    runs: Sequence[GraphRun]
    batch: bool = False
    idempotency_key: str | None = None
    # A batch's retry adds runs to its batch (``batch_id``), re-running ``replaces``.
    batch_id: uuid.UUID | None = None
    replaces: tuple[uuid.UUID, ...] = ()

    def request_hash(self) -> str:
        """What the caller asked for, to tell a retried batch from a different one."""
        asked = [
            {
                "hash": item.run.request_hash(),
                "ref": item.node.ref,
                "depends_on": list(item.node.depends_on),
                "run_at": item.run_at.isoformat() if item.run_at else None,
            }
            for item in self.runs
        ]
        return json_digest(asked)


@dataclass(frozen=True)
class GraphResult:
    """The batch (if any), each run's id in the order submitted, and whether this call wrote
    them (False: an idempotent replay). A write also tells what it wrote, so no one needs to
    read it back: the time on the runs, which were written failed, and each run's dependencies
    as ``(ref, run id)`` (the ref of a run outside the graph as stored, or None)."""

    batch_id: uuid.UUID | None
    run_ids: list[uuid.UUID]
    created: bool
    requested_at: datetime | None = None
    failed: tuple[bool, ...] = ()
    dependencies: tuple[tuple[tuple[str | None, uuid.UUID], ...], ...] = ()


# A batch's original runs (not its retries), by ref: every batch run has one.
BATCH_RUN_IDS = text(
    "SELECT ref, id FROM tool_runs WHERE batch_id = :batch_id AND rerun_of IS NULL"
)
FIND_RUN_IDEMPOTENT = text(
    "SELECT id, request_hash FROM tool_runs WHERE tenant = :tenant AND idempotency_key = :key"
)


class GraphWriter:
    """Writes graph submits; a bad item, a missing dependency or a cap refusal writes none."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def submit(
        self, graph: GraphSubmit, caps: AdmissionCaps, *, now: datetime | None = None
    ) -> GraphResult:
        """Write the graph in one transaction. Raises ``GraphProblem`` (and its
        ``UnknownDependency``), ``AdmissionRefused``, ``IdempotencyConflict``."""
        nodes = [item.node for item in graph.runs]
        resolved = resolve(nodes)
        run_ids = [uuid.uuid4() for _ in graph.runs]
        with self._engine.begin() as conn:
            batch_id = graph.batch_id
            if batch_id is not None:
                self._lock_for_retry(conn, batch_id, graph.replaces)
            elif graph.batch:
                batch_id = self._insert_batch(conn, graph, now)
                if batch_id is None:
                    return self._batch_replay(conn, graph)
            existing = self._lock_dependencies(conn, graph.tenant, resolved)
            try:
                self._admit(conn, graph.tenant, len(graph.runs), caps, now)
            except AdmissionRefused:
                if graph.batch or graph.idempotency_key is None:
                    raise
                conn.rollback()  # a single run's replay is never refused: it creates nothing
                replayed = self._run_replay(graph)
                if replayed is None:
                    raise
                return replayed
            begin = starts(resolved, nodes, run_ids, existing)
            params = self._graph_params(graph, resolved, run_ids, begin, batch_id, now)
            row = conn.execute(INSERT_GRAPH, params).one()
            if row.inserted == 0:  # a single run's Idempotency-Key, used before
                conn.rollback()
                replayed = self._run_replay(graph)
                assert replayed is not None  # ON CONFLICT waited for the first writer
                return replayed
        return GraphResult(
            batch_id=batch_id,
            run_ids=run_ids,
            created=True,
            requested_at=row.requested_at,
            failed=tuple(start.error is not None for start in begin),
            dependencies=_dependencies(graph, resolved, run_ids, existing),
        )

    def write_in(
        self, conn: Connection, graph: GraphSubmit, caps: AdmissionCaps, *, now: datetime | None
    ) -> list[uuid.UUID]:
        """Write runs that depend on nothing, of no batch and without an Idempotency-Key, in
        the caller's transaction (a schedule's slots); their ids. Raises
        ``AdmissionRefused``; a slot fired before raises the database's ``IntegrityError``."""
        assert not graph.batch and graph.idempotency_key is None
        resolved = resolve([item.node for item in graph.runs])
        assert not resolved.existing()
        run_ids = [uuid.uuid4() for _ in graph.runs]
        self._admit(conn, graph.tenant, len(graph.runs), caps, now)
        begin = starts(resolved, [item.node for item in graph.runs], run_ids, {})
        conn.execute(INSERT_GRAPH, self._graph_params(graph, resolved, run_ids, begin, None, now))
        return run_ids

    def cancel_batch(self, batch_id: uuid.UUID, *, now: datetime | None = None) -> int:
        """Flag the batch's running runs and cancel its queued ones (in the lock order of
        ``CANCEL_BATCH``); how many it touched."""
        params = {"batch_id": batch_id, "now": now}
        with self._engine.begin() as conn:
            return sum(len(conn.execute(statement, params).all()) for statement in CANCEL_BATCH)

    def _lock_for_retry(
        self, conn: Connection, batch_id: uuid.UUID, replaces: Sequence[uuid.UUID]
    ) -> None:
        params = {"batch_id": batch_id, "replaced": list(replaces)}
        row = conn.execute(LOCK_BATCH_FOR_RETRY, params).first()
        if row is None:
            raise LookupError(f"no batch {batch_id}")
        if row.already_retried:
            raise BatchRetried("these runs of the batch were retried already")

    def _insert_batch(
        self, conn: Connection, graph: GraphSubmit, now: datetime | None
    ) -> uuid.UUID | None:
        params = {
            "id": uuid.uuid4(),
            "tenant": graph.tenant,
            "size": len(graph.runs),
            "idempotency_key": graph.idempotency_key,
            "request_hash": graph.request_hash() if graph.idempotency_key else None,
            "now": now,
        }
        row = conn.execute(INSERT_BATCH, params).first()
        return None if row is None else uuid.UUID(str(row.id))

    def _batch_replay(self, conn: Connection, graph: GraphSubmit) -> GraphResult:
        key = {"tenant": graph.tenant, "key": graph.idempotency_key}
        found = conn.execute(FIND_BATCH_IDEMPOTENT, key).one()
        if found.request_hash != graph.request_hash():
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different batch"
            )
        by_ref = {row.ref: row.id for row in conn.execute(BATCH_RUN_IDS, {"batch_id": found.id})}
        ids = [by_ref[item.node.ref] for item in graph.runs]
        return GraphResult(batch_id=found.id, run_ids=ids, created=False)

    def _run_replay(self, graph: GraphSubmit) -> GraphResult | None:
        """The run a single run's Idempotency-Key made before, if any (else None)."""
        if graph.idempotency_key is None:
            return None
        (item,) = graph.runs
        with self._engine.connect() as conn:
            key = {"tenant": graph.tenant, "key": graph.idempotency_key}
            found = conn.execute(FIND_RUN_IDEMPOTENT, key).first()
        if found is None:
            return None
        if found.request_hash != _single_hash(item):
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request"
            )
        return GraphResult(batch_id=None, run_ids=[found.id], created=False)

    def _lock_dependencies(
        self, conn: Connection, tenant: str, resolved: Resolved
    ) -> dict[uuid.UUID, Dependency]:
        wanted = resolved.existing()
        if not wanted:
            return {}
        rows = conn.execute(LOCK_DEPENDENCIES, {"ids": wanted, "tenant": tenant}).all()
        found = {
            row.id: Dependency(status=row.status, error_code=row.error_code, ref=row.ref)
            for row in rows
        }
        for index, deps in enumerate(resolved.external):
            for run_id in deps:
                if run_id not in found:
                    raise UnknownDependency(f"depends_on names {run_id}: no such run", index)
        return found

    def _admit(
        self,
        conn: Connection,
        tenant: str,
        count: int,
        caps: AdmissionCaps,
        now: datetime | None,
    ) -> None:
        params = {"tenant": tenant, "n": count, "now": now, **caps.tenant_params()}
        decided = conn.execute(ADMIT_MANY, params).one()
        if decided.refused is not None:
            raise caps.refusal(decided.refused, decided.window_retry_after)

    def _graph_params(
        self,
        graph: GraphSubmit,
        resolved: Resolved,
        run_ids: list[uuid.UUID],
        begin: Sequence[Start],
        batch_id: uuid.UUID | None,
        now: datetime | None,
    ) -> dict[str, Any]:
        nodes = [item.node for item in graph.runs]
        edges = [
            (run_ids[i], dep)
            for i in range(len(nodes))
            for dep in (*(run_ids[j] for j in resolved.internal[i]), *resolved.external[i])
        ]
        single = not graph.batch
        depended = {edge[1] for edge in edges}
        specs: dict[str, int] = {}  # distinct specs as JSON: their index
        last: tuple[dict[str, Any] | None, int] = (None, -1)
        items = []
        for index, item in enumerate(graph.runs):
            run = item.run
            if run.spec != last[0]:  # runs in a row of one tool share a spec: dumped once
                spec = json.dumps(run.spec, sort_keys=True)
                last = (run.spec, specs.setdefault(spec, len(specs)))
            items.append(
                {
                    "run_id": str(run_ids[index]),
                    "tool": run.tool,
                    "spec": last[1],
                    "input": run.input,
                    "queue": run.queue,
                    "priority": run.priority,
                    "max_attempts": run.max_attempts,
                    "timeout_seconds": run.timeout_seconds,
                    "ref": item.node.ref,
                    "run_at": item.run_at.isoformat() if item.run_at else None,
                    "waiting_on": begin[index].waiting_on,
                    "error": begin[index].error,
                    "callback_url": run.callback_url,
                    "request_hash": (
                        _single_hash(item) if single and graph.idempotency_key else None
                    ),
                    "rerun_of": str(run.rerun_of) if run.rerun_of else None,
                    "has_dependents": run_ids[index] in depended,
                    "concurrency_key": run.concurrency_key,
                    "flow_scopes": list(run.flow_scopes) if run.flow_scopes else None,
                    "schedule_id": str(item.schedule_id) if item.schedule_id else None,
                    "schedule_slot": (
                        item.schedule_slot.isoformat() if item.schedule_slot else None
                    ),
                }
            )
        return {
            "tenant": graph.tenant,
            "batch_id": batch_id,
            "idempotency_key": graph.idempotency_key if single else None,
            "items": json.dumps(items),
            "specs": "[" + ",".join(specs) + "]",
            "edges": json.dumps([[str(run_id), str(dep)] for run_id, dep in edges]),
            "now": now,
        }


def _dependencies(
    graph: GraphSubmit,
    resolved: Resolved,
    run_ids: Sequence[uuid.UUID],
    existing: dict[uuid.UUID, Dependency],
) -> tuple[tuple[tuple[str | None, uuid.UUID], ...], ...]:
    """Each run's dependencies as ``(ref, run id)``, in the order a read of the batch lists
    them (by ref, a run without one last, then by id)."""
    found = []
    for i in range(len(graph.runs)):
        deps = [(graph.runs[j].node.ref, run_ids[j]) for j in resolved.internal[i]]
        deps += [(existing[dep].ref, dep) for dep in resolved.external[i]]
        deps.sort(key=lambda dep: (dep[0] is None, dep[0] or "", dep[1]))
        found.append(tuple(deps))
    return tuple(found)


def _single_hash(item: GraphRun) -> str:
    """A single run's request hash, counting its dependencies and start time."""
    asked = {
        "run": item.run.request_hash(),
        "depends_on": sorted(item.node.depends_on),
        "run_at": item.run_at.isoformat() if item.run_at else None,
    }
    return json_digest(asked)
