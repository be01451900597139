"""The runs list over plain HTTP: search by id, prefix, input and error text; the batch and
date filters kept in the URL; the error-code column; bulk cancel, delete and re-run, asked
first and then reported, tenant-scoped and CSRF-protected."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.run_search import SearchIn, parse_search
from runyard.domain.states import ErrorCode, RunStatus
from runyard.queue import JobQueue
from runyard.reads.run_search import (
    TEXT_SEARCH_WINDOW,
    RunSearch,
    filtered,
    search_runs,
    window_marks,
)
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import bearer, make_app
from tests.integration.api.test_ui_http import csrf, log_in


@pytest.fixture
def ui(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as client:
        yield client


def submit(client: TestClient, engine: Engine, tenant: str, value: Any, tool: str = "echo") -> str:
    response = client.post(
        "/v1/runs", json={"tool": tool, "input": value}, headers=bearer(engine, tenant)
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def fail_all(queue: JobQueue, error: str) -> None:
    for job in queue.claim(worker_id="w", engine_id="e", limit=100, lease_seconds=30):
        outcome = AttemptResult(
            status=RunStatus.FAILED, exit_code=3, error_code=ErrorCode.TOOL_FAILED, error=error
        )
        assert queue.finalize(job.job_id, job.lease_token, outcome)


def shown(html: str) -> set[str]:
    return set(re.findall(r'<tr data-run="([0-9a-f-]{36})"', html))


def test_search__finds_by_id_prefix_input_and_error_text(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    failing = submit(ui, engine, "acme", {"word": "zebra"})
    fail_all(queue, "the disk is full")
    plain = submit(ui, engine, "acme", {"word": "giraffe_50%"})
    others = submit(ui, engine, "other", {"word": "zebra"})
    log_in(ui, create_api_key(engine, "acme"))

    assert shown(ui.get(f"/ui/runs?q={failing}").text) == {failing}
    assert shown(ui.get(f"/ui/runs?q={plain[:8]}").text) == {plain}
    assert shown(ui.get("/ui/runs?q=zebra").text) == {failing}  # not the other tenant's
    assert shown(ui.get("/ui/runs?q=DISK+IS").text) == {failing}
    assert shown(ui.get("/ui/runs?q=zebra&in=error").text) == set()
    assert shown(ui.get("/ui/runs?q=disk&in=input").text) == set()
    # LIKE's wildcards are text like any other.
    assert shown(ui.get("/ui/runs?q=_50%25").text) == {plain}
    assert shown(ui.get("/ui/runs?q=raffe%2550").text) == set()
    assert shown(ui.get(f"/ui/runs?q={others}").text) == set()
    page = ui.get("/ui/runs?q=zebra")
    assert 'value="zebra"' in page.text  # the box keeps the query
    assert "<code" in page.text and "tool_failed" in page.text  # the error-code column


def test_filters__batch_and_requested_between_live_in_the_links(ui: TestClient, engine: Engine):
    response = ui.post(
        "/v1/batches",
        json={"runs": [{"ref": "a", "tool": "echo"}]},
        headers=bearer(engine, "acme"),
    )
    assert response.status_code == 202, response.text
    batch = response.json()
    in_batch = batch["run_ids"]["a"]
    old = submit(ui, engine, "acme", {})
    new = submit(ui, engine, "acme", {})
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE tool_runs SET requested_at = '2026-01-15 12:00+00' WHERE id = :id"),
            {"id": old},
        )
    log_in(ui, create_api_key(engine, "acme"))

    assert shown(ui.get(f"/ui/runs?batch={batch['id']}").text) == {in_batch}
    assert shown(ui.get("/ui/runs?from=2026-01-15&to=2026-01-15").text) == {old}
    assert shown(ui.get("/ui/runs?to=2026-01-14").text) == set()
    assert new in shown(ui.get("/ui/runs?from=2026-01-16").text)
    # A mangled value is dropped, not an error page.
    assert ui.get("/ui/runs?from=2026-02-30&batch=nope&in=bogus").status_code == 200
    # The live refresh and the pager keep the filters.
    page = ui.get(f"/ui/runs?batch={batch['id']}&from=2026-01-01")
    assert f"/ui/runs/rows?batch={batch['id']}&amp;from=2026-01-01" in page.text
    assert f'name="batch" value="{batch["id"]}"' in page.text


def test_text_search__reads_a_bounded_window_and_offers_to_go_further(
    engine: Engine, queue: JobQueue, ui: TestClient
):
    wanted = submit(ui, engine, "acme", {"word": "needle"})
    with engine.begin() as conn:
        # The window's worth of newer runs, copied from the first.
        conn.execute(
            text(
                """
                INSERT INTO tool_runs (id, tenant, tool, spec, input, requested_at)
                SELECT gen_random_uuid(), tenant, tool, spec, '{}', now() + make_interval(secs => g)
                FROM tool_runs, generate_series(1, :n) g WHERE id = :id
                """
            ),
            {"n": TEXT_SEARCH_WINDOW, "id": wanted},
        )
    search = RunSearch(tenant="acme", term=parse_search("needle", SearchIn.AUTO))
    first = search_runs(engine, search, limit=25)
    assert first.runs == [] and first.searched_to is not None and first.next_cursor
    further = search_runs(engine, search, limit=25, cursor=first.next_cursor)
    assert [str(run.id) for run in further.runs] == [wanted]
    assert further.next_cursor is None


def bulk(client: TestClient, fields: dict[str, Any]) -> Any:
    return client.post("/ui/runs/bulk", data={"csrf_token": csrf(client, "/ui/runs"), **fields})


def test_bulk_cancel__asks_first_then_reports_what_it_did(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    finished = submit(ui, engine, "acme", {})
    fail_all(queue, "boom")
    queued = [submit(ui, engine, "acme", {}) for _ in range(2)]
    theirs = submit(ui, engine, "other", {})
    log_in(ui, create_api_key(engine, "acme"))

    fields = {"action": "cancel", "scope": "selected", "run": [finished, *queued, theirs]}
    asked = bulk(ui, fields)
    assert asked.status_code == 200
    assert "Cancel 2 runs?" in asked.text
    assert "will be skipped (already finished)" in asked.text
    assert theirs not in asked.text  # another tenant's run is not even named
    assert count_status(engine, "cancelled") == 0  # nothing happened yet

    done = bulk(ui, {**fields, "confirmed": "yes"})
    assert done.status_code == 303
    report = ui.get(done.headers["location"])
    assert "2 cancelled, 1 skipped (already finished)." in report.text
    assert count_status(engine, "cancelled") == 2
    with engine.connect() as conn:
        status = conn.scalar(text("SELECT status FROM tool_runs WHERE id = :id"), {"id": theirs})
    assert status == "queued"


def count_status(engine: Engine, status: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.scalar(text("SELECT count(*) FROM tool_runs WHERE status = :s"), {"s": status})
        )


def test_bulk_delete_and_rerun__act_on_all_matching_within_the_tenant(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    failed = [submit(ui, engine, "acme", {"n": i}) for i in range(2)]
    fail_all(queue, "flaky network")
    submit(ui, engine, "other", {"n": 1})
    fail_all(queue, "flaky network")
    waiting = submit(ui, engine, "acme", {"n": 9})
    log_in(ui, create_api_key(engine, "acme"))

    rerun = {"action": "rerun", "scope": "matching", "q": "flaky", "confirmed": "yes"}
    done = bulk(ui, rerun)
    assert done.status_code == 303
    assert "q=flaky" in done.headers["location"]  # back to the same filtered view
    assert "2 re-run." in ui.get(done.headers["location"]).text
    with engine.connect() as conn:
        reruns = conn.execute(
            text("SELECT tenant, CAST(rerun_of AS text) FROM tool_runs WHERE rerun_of IS NOT NULL")
        ).all()
    assert sorted(reruns) == sorted(("acme", run_id) for run_id in failed)

    asked = bulk(ui, {"action": "delete", "scope": "matching", "status": "failed"})
    assert "Delete 2 runs?" in asked.text and "cannot be undone" in asked.text
    done = bulk(
        ui, {"action": "delete", "scope": "matching", "status": "failed", "confirmed": "yes"}
    )
    assert "2 deleted." in ui.get(done.headers["location"]).text
    with engine.connect() as conn:
        left = conn.execute(text("SELECT tenant, status FROM tool_runs ORDER BY 1, 2")).all()
    assert ("other", "failed") in left  # the other tenant's failed run stays
    assert ("acme", "failed") not in left
    skipped = bulk(
        ui, {"action": "delete", "scope": "selected", "run": waiting, "confirmed": "yes"}
    )
    assert "0 deleted, 1 skipped" in ui.get(skipped.headers["location"]).text


def test_bulk__needs_the_csrf_token_and_a_known_action(ui: TestClient, engine: Engine):
    run_id = submit(ui, engine, "acme", {})
    log_in(ui, create_api_key(engine, "acme"))
    forged = ui.post(
        "/ui/runs/bulk",
        data={"action": "cancel", "scope": "selected", "run": run_id, "confirmed": "yes"},
    )
    assert forged.status_code == 403
    assert bulk(ui, {"action": "explode", "scope": "matching"}).status_code == 400
    assert count_status(engine, "cancelled") == 0


def plan_of(engine: Engine, statement: Any) -> str:
    with engine.connect() as conn:
        compiled = statement.compile(dialect=conn.dialect)
        rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).scalars()
        return "\n".join(rows)


@pytest.mark.parametrize(
    ("search", "index"),
    [
        (RunSearch(tenant="acme", term=parse_search("3f2a", SearchIn.AUTO)), "pk_tool_runs"),
        (
            RunSearch(tenant="acme", requested_from=datetime(2026, 11, 1, tzinfo=UTC)),
            "ix_tool_runs_tenant_requested",
        ),
        (RunSearch(tenant="acme", batch_id=uuid.uuid4()), "ix_tool_runs_batch"),
    ],
)
def test_search_statements__read_through_an_index(engine: Engine, search: RunSearch, index: str):
    seed_month(engine)
    plan = plan_of(engine, filtered(search).limit(26))
    assert f" {index} " in plan and "Seq Scan" not in plan, plan


def test_text_search__scans_a_limited_window_of_the_tenants_index(engine: Engine):
    seed_month(engine)
    term = parse_search("needle", SearchIn.AUTO)
    assert term is not None
    plan = plan_of(engine, window_marks(filtered(RunSearch(tenant="acme", term=term)), term))
    assert "ix_tool_runs_tenant_requested" in plan and "Seq Scan" not in plan, plan
    assert re.search(r"Limit .*\n.*Index Scan using ix_tool_runs_tenant_requested", plan), plan


def seed_month(engine: Engine) -> None:
    """A month of runs of two tenants, and fresh statistics, so plans are the real ones."""
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO tool_runs (id, tenant, tool, spec, input, status, requested_at)
                SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'acme' ELSE 'other' END,
                       'echo', '{}', '{"n": 1}', 'succeeded', now() - make_interval(mins => g * 5)
                FROM generate_series(1, 8000) g
                """
            )
        )
        conn.execute(text("ANALYZE tool_runs"))


def test_bulk_over_a_text_search__says_the_window_it_looked_at(ui: TestClient, engine: Engine):
    submit(ui, engine, "acme", {"word": "needle"})
    seed_month(engine)  # 4,000 newer runs of acme
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE tool_runs SET requested_at = now() - interval '60 days'"
                " WHERE input ? 'word'"
            )
        )
    log_in(ui, create_api_key(engine, "acme"))
    asked = bulk(ui, {"action": "cancel", "scope": "matching", "q": "needle"})
    assert asked.status_code == 200
    assert 'id="bulk-window"' in asked.text and "newest 2000 runs" in asked.text
    assert "Cancel 0 runs?" in asked.text
