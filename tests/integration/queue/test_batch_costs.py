"""What reading and retrying batches costs the database: a page of batches is one statement
that returns a row per batch and status (no run, no edge), however many runs and edges the
batches hold; a retry's check of what was re-run already probes an index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, TextClause, text

import runyard.submission.batches
from runyard.domain.graph import Node
from runyard.platform.db import autocommit
from runyard.queue import AdmissionCaps, ApiQueue
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter
from runyard.queue.graph_sql import LOCK_BATCH_FOR_RETRY
from runyard.registry.tools import ToolRegistry
from runyard.submission.batches import Batches, ListedBatch
from tests.integration.queue.test_queue import T0, new_run

RUNS_PER_BATCH = 40


def dense_batch(writer: GraphWriter) -> None:
    """A batch whose every run depends on every run before it (up to 100): 780 edges."""
    runs = [
        GraphRun(new_run(), Node(f"r{i}", tuple(f"r{j}" for j in range(max(0, i - 100), i))))
        for i in range(RUNS_PER_BATCH)
    ]
    writer.submit(GraphSubmit("acme", runs, batch=True), AdmissionCaps(), now=T0)


@contextmanager
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """The statements ``runyard.submission.batches`` runs meanwhile, each with the rows it
    returned."""
    seen: list[tuple[str, int]] = []

    def recording(engine: Engine, statement: TextClause, params: Mapping[str, Any]) -> list[Any]:
        rows = autocommit(engine, statement, params)
        seen.append((statement.text, len(rows)))
        return rows

    with monkeypatch.context() as patch:
        patch.setattr(runyard.submission.batches, "autocommit", recording)
        yield seen


def test_batch_page__one_statement_no_edges_a_row_per_batch_and_status(
    engine: Engine, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
):
    writer = GraphWriter(engine)
    batches = Batches(ApiQueue(engine), registry, AdmissionCaps())
    dense_batch(writer)
    with statements(monkeypatch) as one_batch:
        assert len(batches.page("acme", limit=100)) == 1
    for _ in range(29):
        dense_batch(writer)
    with engine.connect() as conn:
        edges = conn.execute(text("SELECT count(*) FROM tool_run_deps")).scalar_one()
    assert edges == 30 * sum(range(RUNS_PER_BATCH))
    with statements(monkeypatch) as thirty:
        page = batches.page("acme", limit=100)
    assert len(page) == 30 and all(isinstance(listed, ListedBatch) for listed in page)
    assert {listed.counts["queued"] for listed in page} == {RUNS_PER_BATCH}
    assert len(one_batch) == len(thirty) == 1
    ((statement, rows),) = thirty
    assert "tool_run_deps" not in statement
    assert rows == 30  # one status each: a row per batch, not a row per run or edge


def test_batch_view__reads_the_edges_of_its_own_batch_only(
    engine: Engine, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
):
    writer = GraphWriter(engine)
    batches = Batches(ApiQueue(engine), registry, AdmissionCaps())
    for _ in range(3):
        dense_batch(writer)
    (newest, *_) = batches.page("acme", limit=1)
    with statements(monkeypatch) as seen:
        view = batches.view(newest.id, "acme")
    assert view is not None
    assert sum(len(run.depends_on) for run in view.runs) == sum(range(RUNS_PER_BATCH))
    edge_rows = [rows for statement, rows in seen if "tool_run_deps" in statement]
    assert edge_rows == [sum(range(RUNS_PER_BATCH))]


def test_retry_check__probes_the_rerun_of_index(engine: Engine):
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO tool_runs (id, tenant, tool, spec, input, status, rerun_of)
                SELECT gen_random_uuid(), 'acme', 'echo', '{}', '{}', 'failed',
                       CASE WHEN n % 10 = 0 THEN gen_random_uuid() END
                FROM generate_series(1, 20000) AS n
                """
            )
        )
        conn.execute(text("ANALYZE tool_runs"))
        batch_id = conn.execute(
            text(
                "INSERT INTO batches (id, tenant, size) VALUES (gen_random_uuid(), 'acme', 1)"
                " RETURNING id"
            )
        ).scalar_one()
        replaced = list(conn.execute(text("SELECT id FROM tool_runs LIMIT 3")).scalars())
        explain = text("EXPLAIN (FORMAT JSON) " + LOCK_BATCH_FOR_RETRY.text)
        plan = conn.execute(explain, {"batch_id": batch_id, "replaced": replaced}).scalar_one()
    scans = {
        (node["Node Type"], node.get("Index Name"))
        for node in plan_nodes(plan[0]["Plan"])
        if node.get("Relation Name") == "tool_runs"
    }
    assert scans <= {
        ("Index Only Scan", "ix_tool_runs_rerun_of"),
        ("Index Scan", "ix_tool_runs_rerun_of"),
        ("Bitmap Heap Scan", None),
    }
    assert any(
        index == "ix_tool_runs_rerun_of"
        for node in plan_nodes(plan[0]["Plan"])
        for index in [node.get("Index Name")]
    )


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node`` of an EXPLAIN (FORMAT JSON) plan and every node under it."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
