"""The dashboard's workflow pages over plain HTTP: the batch page and its graph, the batches
list, cancel and retry, the run page's links, scheduled runs, tenancy and escaping."""

from __future__ import annotations

import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import ErrorCode, RunStatus
from runyard.queue import JobQueue
from runyard.reads.dashboard_workflows import batch_summaries, scheduled_runs
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import bearer, count, make_app, run_status
from tests.integration.api.test_ui_http import csrf, log_in

SVG = "{http://www.w3.org/2000/svg}"
SUCCESS = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"ok": 1})
FAILURE = AttemptResult(
    status=RunStatus.FAILED, exit_code=2, error_code=ErrorCode.TOOL_FAILED, error="exit 2"
)
FRAGMENT = {"X-Runyard-Fragment": "1"}


@pytest.fixture
def ui(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as client:
        yield client


def submit_batch(client: TestClient, engine: Engine, tenant: str, runs: list[Any]) -> Any:
    response = client.post("/v1/batches", json={"runs": runs}, headers=bearer(engine, tenant))
    assert response.status_code == 202, response.text
    return response.json()


PIPELINE = [
    {"ref": "build", "tool": "echo"},
    {"ref": "test", "tool": "echo", "depends_on": ["build"]},
    {"tool": "echo", "depends_on": ["build", "test"]},  # ref "#2"
]


def finish(queue: JobQueue, failing: Collection[str] = ()) -> set[str]:
    """Run every claimable job, failing those in ``failing``; the run ids."""
    jobs = queue.claim(worker_id="w", engine_id="e", limit=100, lease_seconds=30)
    for job in jobs:
        outcome = FAILURE if str(job.run_id) in failing else SUCCESS
        assert queue.finalize(job.job_id, job.lease_token, outcome)
    return {str(job.run_id) for job in jobs}


def graph_of(html: str) -> ET.Element:
    found = re.search(r'<svg class="graph".*?</svg>', html, re.S)
    assert found is not None, html
    return ET.fromstring(found.group(0))


def nodes_of(html: str) -> dict[str, ET.Element]:
    return {str(node.get("data-ref")): node for node in graph_of(html).iter(f"{SVG}a")}


def test_batch_page__draws_each_ref_linked_and_coloured_with_its_edges(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    batch = submit_batch(ui, engine, "acme", PIPELINE)
    ids = batch["run_ids"]
    assert finish(queue) == {ids["build"]}
    log_in(ui, create_api_key(engine, "acme"))

    page = ui.get(f"/ui/batches/{batch['id']}")
    assert page.status_code == 200
    nodes = nodes_of(page.text)
    assert set(nodes) == {"build", "test", "#2"}
    for ref, status in (("build", "succeeded"), ("test", "queued"), ("#2", "queued")):
        assert nodes[ref].get("href") == f"/ui/runs/{ids[ref]}"
        assert nodes[ref].get("class") == f"node s-{status}"
    edges = sorted(
        (str(edge.get("class")), str(edge.findtext(f"{SVG}title")))
        for edge in graph_of(page.text).iter(f"{SVG}path")
        if edge.get("marker-end")
    )
    assert edges == [
        ("edge met", "#2 depends on build"),
        ("edge met", "test depends on build"),
        ("edge pending", "#2 depends on test"),
    ]
    counts = re.search(r'<dd id="batch-counts">(.*?)</dd>', page.text, re.S)
    assert counts is not None
    assert re.findall(r'class="count s-(\w+)">(\d+)', counts.group(1)) == [
        ("queued", "2"),
        ("succeeded", "1"),
    ]
    # The runs table: a row per ref with an anchor, in-batch dependencies link to it.
    assert 'id="ref-build"' in page.text and 'id="ref-#2"' in page.text
    assert 'href="#ref-test"' in page.text
    assert 'id="cancel-batch"' in page.text and 'id="retry-batch"' not in page.text
    assert 'href="/ui/batches" aria-current="page"' in page.text
    # The page embeds the fragment it re-fetches, and the fragment's tag.
    etag = re.search(r'data-etag="(&#34;|&quot;)([0-9a-f]{32})', page.text)
    assert etag is not None


def test_batch_panel__is_304_until_something_changes(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    batch = submit_batch(ui, engine, "acme", PIPELINE)
    log_in(ui, create_api_key(engine, "acme"))
    url = f"/ui/batches/{batch['id']}/panel"
    first = ui.get(url, headers=FRAGMENT)
    assert first.status_code == 200 and "<html" not in first.text
    assert '<svg class="graph"' in first.text
    etag = first.headers["etag"]
    page = ui.get(f"/ui/batches/{batch['id']}").text
    assert f'data-etag="{etag.replace(chr(34), "&#34;")}"' in page
    same = ui.get(url, headers={**FRAGMENT, "If-None-Match": etag})
    assert same.status_code == 304 and same.content == b""
    finish(queue)
    changed = ui.get(url, headers={**FRAGMENT, "If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    # Relative ages are left to the page's script: only the clock moving changes nothing.
    assert "ago)" not in changed.text and 'class="rel" data-since=' in changed.text
    assert nodes_of(changed.text)["build"].get("class") == "node s-succeeded"


def test_batch_page__another_tenants_batch_is_404_everywhere(ui: TestClient, engine: Engine):
    theirs = submit_batch(ui, engine, "globex", PIPELINE)
    mine = submit_batch(ui, engine, "acme", [{"ref": "solo", "tool": "echo"}])
    log_in(ui, create_api_key(engine, "acme"))
    token = csrf(ui)
    for path in (f"/ui/batches/{theirs['id']}", f"/ui/batches/{theirs['id']}/panel"):
        response = ui.get(path)
        assert response.status_code == 404, path
        assert f"no batch {theirs['id']}" in response.text
    for action in ("cancel", "retry"):
        refused = ui.post(f"/ui/batches/{theirs['id']}/{action}", data={"csrf_token": token})
        assert refused.status_code == 404, action
    assert {run_status(engine, run) for run in theirs["run_ids"].values()} == {"queued"}
    for junk in ("not-a-uuid", str(uuid.uuid4())):
        assert ui.get(f"/ui/batches/{junk}").status_code == 404
    listing = ui.get("/ui/batches").text
    assert mine["id"] in listing and theirs["id"] not in listing

    admin = TestClient(ui.app, follow_redirects=False)
    log_in(admin, create_api_key(engine, "ops", admin=True))
    assert admin.get(f"/ui/batches/{theirs['id']}").status_code == 200
    everyone = admin.get("/ui/batches").text
    assert mine["id"] in everyone and theirs["id"] in everyone and "globex" in everyone


def test_batch_pages__need_a_session(ui: TestClient, engine: Engine):
    batch = submit_batch(ui, engine, "acme", PIPELINE)
    page = ui.get(f"/ui/batches/{batch['id']}")
    assert page.status_code == 303
    assert page.headers["location"] == f"/ui/login?next=/ui/batches/{batch['id']}"
    assert ui.get(f"/ui/batches/{batch['id']}/panel", headers=FRAGMENT).status_code == 401
    assert ui.get("/ui/batches/rows", headers=FRAGMENT).status_code == 401


def test_batch_actions__cancel_then_retry_with_the_forms_csrf_token(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    batch = submit_batch(ui, engine, "acme", PIPELINE)
    ids = batch["run_ids"]
    page = f"/ui/batches/{batch['id']}"
    log_in(ui, create_api_key(engine, "acme"))
    for data in ({}, {"csrf_token": "forged"}):
        assert ui.post(f"{page}/cancel", data=data).status_code == 403
        assert ui.post(f"{page}/retry", data=data).status_code == 403
    cross = ui.post(
        f"{page}/cancel", data={"csrf_token": csrf(ui)}, headers={"Origin": "https://x.test"}
    )
    assert cross.status_code == 403
    assert run_status(engine, ids["build"]) == "queued"

    token = csrf(ui, page)
    early = ui.post(f"{page}/retry", data={"csrf_token": token})
    assert early.headers["location"] == f"{page}?notice=batch_not_finished"
    done = ui.post(f"{page}/cancel", data={"csrf_token": token})
    assert done.status_code == 303
    assert done.headers["location"] == f"{page}?notice=batch_cancel_requested"
    assert {run_status(engine, run) for run in ids.values()} == {"cancelled"}
    shown = ui.get(done.headers["location"]).text
    assert "Cancel requested" in shown
    assert 'id="retry-batch"' in shown and 'id="cancel-batch"' not in shown
    assert 'data-terminal="true"' in shown

    again = ui.post(f"{page}/retry", data={"csrf_token": token})
    assert again.headers["location"] == f"{page}?notice=batch_retry_started"
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE rerun_of IS NOT NULL") == 3
    retried = ui.get(again.headers["location"]).text
    assert "Retry started" in retried
    nodes = nodes_of(retried)
    assert all(node.get("class") == "node s-queued" for node in nodes.values())
    assert all(node.get("href") != f"/ui/runs/{ids[ref]}" for ref, node in nodes.items())
    finish(queue)
    finish(queue)
    finish(queue)
    nothing = ui.post(f"{page}/retry", data={"csrf_token": token})
    assert nothing.headers["location"] == f"{page}?notice=batch_nothing_to_retry"


def test_batch_page__escapes_stored_text(ui: TestClient, engine: Engine, queue: JobQueue):
    hostile = '<script>alert("x")</script>'
    batch = submit_batch(ui, engine, "acme", [{"ref": "a.b-c_d", "tool": "echo"}, {"tool": "echo"}])
    finish(queue, failing=set(batch["run_ids"].values()))
    # Refs and tool names are held to patterns on the way in; error codes and tool names
    # stored by another version or by hand are still shown as text.
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE tool_runs SET error_code = :bad, tool = :bad WHERE batch_id = :id"),
            {"bad": hostile, "id": batch["id"]},
        )
    log_in(ui, create_api_key(engine, "acme"))
    for path in (f"/ui/batches/{batch['id']}", "/ui/batches", f"/ui/batches/{batch['id']}/panel"):
        body = ui.get(path).text
        assert "<script>alert" not in body, path
    body = ui.get(f"/ui/batches/{batch['id']}").text
    assert "&lt;script&gt;alert(" in body
    graph_of(body)  # still well-formed
    run_page = ui.get(f"/ui/runs/{batch['run_ids']['#1']}").text
    assert "<script>alert" not in run_page
    assert f'href="/ui/batches/{batch["id"]}#ref-%231"' in run_page


def test_batches_list__newest_first_with_counts_pages_and_live_rows(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    made = [submit_batch(ui, engine, "acme", [{"ref": "x", "tool": "echo"}]) for _ in range(26)]
    failing = {made[-1]["run_ids"]["x"]}
    finish(queue, failing=failing)
    log_in(ui, create_api_key(engine, "acme"))

    def shown(html: str) -> list[str]:
        return re.findall(r'<tr data-batch="([0-9a-f-]{36})"', html)

    first = ui.get("/ui/batches")
    assert first.status_code == 200
    newest = [batch["id"] for batch in reversed(made)]
    assert shown(first.text) == newest[:25]
    row = re.search(rf'<tr data-batch="{newest[0]}">(.*?)</tr>', first.text, re.S)
    assert row is not None
    assert 'class="status s-failed"' in row.group(1) and "1 failed" in row.group(1)
    assert ">1/1<" in row.group(1)
    older = re.search(r'href="/ui/batches\?cursor=([^"]+)" rel="next"', first.text)
    assert older is not None
    second = ui.get(f"/ui/batches?cursor={older.group(1)}").text
    assert shown(second) == newest[25:] and "« Newest" in second
    rows = ui.get("/ui/batches/rows", headers=FRAGMENT)
    assert rows.status_code == 200 and "<html" not in rows.text
    assert shown(rows.text) == newest[:25]
    assert ui.get("/ui/batches?cursor=junk").status_code == 200
    assert 'href="/ui/batches"' in ui.get("/ui/runs").text  # in the navigation


def test_run_page__links_batch_ref_dependencies_and_the_run_it_reruns(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    batch = submit_batch(ui, engine, "acme", PIPELINE)
    ids = batch["run_ids"]
    finish(queue)  # build succeeds; test and #2 still wait
    log_in(ui, create_api_key(engine, "acme"))

    page = ui.get(f"/ui/runs/{ids['#2']}").text
    linked = re.search(r'<dd id="run-batch">(.*?)</dd>', page, re.S)
    assert linked is not None
    assert f'href="/ui/batches/{batch["id"]}"' in linked.group(1)
    assert f'href="/ui/batches/{batch["id"]}#ref-%232"' in linked.group(1)
    deps = re.search(r'<dd id="run-depends-on">(.*?)</dd>', page, re.S)
    assert deps is not None
    items = re.findall(r"<li>(.*?)</li>", deps.group(1), re.S)
    assert len(items) == 2
    by_ref = {re.search(r"ref <span class=\"mono\">([^<]+)", item).group(1): item for item in items}  # type: ignore[union-attr]
    assert f'href="/ui/runs/{ids["build"]}"' in by_ref["build"]
    assert "s-succeeded" in by_ref["build"] and "waiting for it" not in by_ref["build"]
    assert f'href="/ui/runs/{ids["test"]}"' in by_ref["test"]
    assert "s-queued" in by_ref["test"] and "waiting for it" in by_ref["test"]
    assert 'id="run-rerun-of"' not in page

    # A run outside any batch shows none of it.
    plain = ui.post("/v1/runs", json={"tool": "echo"}, headers=bearer(engine, "acme")).json()
    plain_page = ui.get(f"/ui/runs/{plain['id']}").text
    assert 'id="run-batch"' not in plain_page and 'id="run-depends-on"' not in plain_page

    rerun = ui.post(f"/v1/runs/{ids['build']}/rerun", headers=bearer(engine, "acme")).json()
    rerun_page = ui.get(f"/ui/runs/{rerun['id']}/panel").text
    link = re.search(r'<dd id="run-rerun-of">(.*?)</dd>', rerun_page, re.S)
    assert link is not None and f'href="/ui/runs/{ids["build"]}"' in link.group(1)


def test_scheduled__a_queued_run_with_a_future_run_at_says_so(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    headers = bearer(engine, "acme")
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    scheduled = ui.post("/v1/runs", json={"tool": "echo", "run_at": later}, headers=headers).json()
    due = ui.post("/v1/runs", json={"tool": "echo"}, headers=headers).json()
    log_in(ui, create_api_key(engine, "acme"))

    page = ui.get(f"/ui/runs/{scheduled['id']}").text
    status = re.search(r'<dd id="run-status"[^>]*>(.*?)</dd>', page, re.S)
    assert status is not None and "scheduled" in status.group(1)
    assert re.search(r"<dt>Scheduled for</dt><dd id=\"run-at\"><time", page)
    due_page = ui.get(f"/ui/runs/{due['id']}").text
    assert 'id="run-at"' not in due_page and "tag scheduled" not in due_page

    def row(html: str, run_id: str) -> str:
        found = re.search(rf'<tr data-run="{run_id}">(.*?)</tr>', html, re.S)
        assert found is not None
        return found.group(1)

    listing = ui.get("/ui/runs").text
    assert 'class="tag scheduled"' in row(listing, scheduled["id"])
    assert "scheduled" not in row(listing, due["id"])
    rows = ui.get("/ui/runs/rows", headers=FRAGMENT).text
    assert 'class="tag scheduled"' in row(rows, scheduled["id"])

    # Once its time has passed it is a queued run like any other, and says when it was due.
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE tool_runs SET run_at = now() - interval '1 minute' WHERE id = :id"),
            {"id": scheduled["id"]},
        )
    past = ui.get(f"/ui/runs/{scheduled['id']}").text
    assert "<dt>Run at</dt>" in past and "tag scheduled" not in past
    assert "scheduled" not in row(ui.get("/ui/runs").text, scheduled["id"])


def test_batch_summaries__latest_runs_counted_with_the_batch_status(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    cancelled = submit_batch(ui, engine, "acme", PIPELINE)
    ui.post(f"/v1/batches/{cancelled['id']}/cancel", headers=bearer(engine, "acme"))
    retried = submit_batch(
        ui,
        engine,
        "acme",
        [
            {"ref": "ok", "tool": "echo"},
            {"ref": "flaky", "tool": "echo"},
            {"ref": "after", "tool": "echo", "depends_on": ["ok", "flaky"]},
        ],
    )
    finish(queue, failing={retried["run_ids"]["flaky"]})
    [failed] = batch_summaries(engine, "acme", limit=1)
    assert (failed.id, failed.status) == (uuid.UUID(retried["id"]), "failed")
    assert failed.counts == {"succeeded": 1, "failed": 2} and failed.finished == 3
    assert ui.post(f"/v1/batches/{retried['id']}/retry", headers=bearer(engine, "acme")).is_success
    theirs = submit_batch(ui, engine, "globex", [{"ref": "x", "tool": "echo"}])

    mine = batch_summaries(engine, "acme", limit=10)
    assert [str(s.id) for s in mine] == [retried["id"], cancelled["id"]]
    # Five runs in the retried batch, three refs: only each ref's latest run counts.
    assert (mine[0].status, mine[0].counts, mine[0].size) == (
        "running",
        {"succeeded": 1, "queued": 2},
        3,
    )
    assert (mine[1].status, mine[1].counts) == ("cancelled", {"cancelled": 3})
    everyone = batch_summaries(engine, None, limit=10)
    assert [str(s.id) for s in everyone] == [theirs["id"], retried["id"], cancelled["id"]]
    assert everyone[0].tenant == "globex"
    after_first = batch_summaries(
        engine, None, limit=10, before=(everyone[0].created_at, everyone[0].id)
    )
    assert [s.id for s in after_first] == [s.id for s in everyone[1:]]


def test_scheduled_runs__queued_with_run_at_after_now(ui: TestClient, engine: Engine):
    headers = bearer(engine, "acme")
    start = datetime.now(UTC) + timedelta(hours=1)
    later = ui.post(
        "/v1/runs", json={"tool": "echo", "run_at": start.isoformat()}, headers=headers
    ).json()
    plain = ui.post("/v1/runs", json={"tool": "echo"}, headers=headers).json()
    ids = [uuid.UUID(later["id"]), uuid.UUID(plain["id"])]
    assert scheduled_runs(engine, ids) == {ids[0]}
    assert scheduled_runs(engine, ids, now=start - timedelta(seconds=1)) == {ids[0]}
    assert scheduled_runs(engine, ids, now=start) == set()
    assert scheduled_runs(engine, []) == set()
    ui.post(f"/v1/runs/{later['id']}/cancel", headers=headers)
    assert scheduled_runs(engine, ids) == set()  # cancelled, no longer queued


def test_batch_page__marks_scheduled_runs(ui: TestClient, engine: Engine):
    start = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    batch = submit_batch(
        ui,
        engine,
        "acme",
        [{"ref": "now", "tool": "echo"}, {"ref": "later", "tool": "echo", "run_at": start}],
    )
    log_in(ui, create_api_key(engine, "acme"))
    page = ui.get(f"/ui/batches/{batch['id']}").text
    later_row = re.search(r'<tr id="ref-later"(.*?)</tr>', page, re.S)
    now_row = re.search(r'<tr id="ref-now"(.*?)</tr>', page, re.S)
    assert later_row is not None and now_row is not None
    assert 'class="tag scheduled"' in later_row.group(1)
    assert "scheduled" not in now_row.group(1)
    nodes = nodes_of(page)
    assert "scheduled" in str(nodes["later"].findtext(f"{SVG}title"))
    assert "scheduled" in "".join(nodes["later"].itertext())
    assert "scheduled" not in "".join(nodes["now"].itertext())
    assert "1 waiting for their" in page
