"""The run page over plain HTTP: logs before the details, each line's time, the log as a
download, and Re-run through the API's own action (CSRF-protected, tenant-scoped)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from api.ui import views
from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.reads.dashboard import LogSnapshot, log_snapshot
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import bearer, count, make_app
from tests.integration.api.test_ui_http import csrf, log_in

T0 = datetime(2026, 11, 27, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def ui(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as client:
        yield client


def submit(client: TestClient, engine: Engine, tenant: str) -> str:
    response = client.post(
        "/v1/runs", json={"tool": "echo", "input": {"n": 1}}, headers=bearer(engine, tenant)
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_run_page__logs_come_before_the_details_with_a_time_per_line(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    run_id = submit(ui, engine, "acme")
    (job,) = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
    for chunk in ("first\nsec", "ond\n", "third\n"):
        assert queue.append_log(
            job.job_id, job.lease_token, stream="stdout", text_chunk=chunk, until="t", now=T0
        )
    log_in(ui, create_api_key(engine, "acme"))
    live = ui.get(f"/ui/runs/{run_id}").text
    assert live.index('id="stdout"') < live.index('id="timeline"')
    assert live.index('id="stdout"') < live.index('id="run-result"')
    stamps = re.findall(r'<span class="chunk"( data-time="([0-9:]+)")?', live)
    assert [stamp for _, stamp in stamps] == ["03:04:05", "", "03:04:05"]

    outcome = AttemptResult(
        status=RunStatus.SUCCEEDED, exit_code=0, stdout="first\nsecond\nthird\n"
    )
    assert queue.finalize(job.job_id, job.lease_token, outcome)
    done = ui.get(f"/ui/runs/{run_id}").text
    assert done.count('data-time="03:04:05"') == 2  # the stored log is exactly the chunks
    fragment = ui.get(f"/ui/runs/{run_id}/logs", headers={"X-Runyard-Fragment": "1"}).text
    assert 'data-time="03:04:05"' in fragment


def test_log_download__is_the_apis_text_as_an_attachment(
    ui: TestClient, engine: Engine, queue: JobQueue
):
    run_id = submit(ui, engine, "acme")
    (job,) = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
    outcome = AttemptResult(
        status=RunStatus.FAILED, exit_code=3, stdout="out\n", stderr="err\n", error_code="x"
    )
    assert queue.finalize(job.job_id, job.lease_token, outcome)
    log_in(ui, create_api_key(engine, "acme"))
    page = ui.get(f"/ui/runs/{run_id}").text
    assert f'href="/ui/runs/{run_id}/log.txt?stream=stderr"' in page
    got = ui.get(f"/ui/runs/{run_id}/log.txt", params={"stream": "stderr"})
    assert got.status_code == 200 and got.text == "err\n"
    assert got.headers["content-type"].startswith("text/plain")
    assert got.headers["content-disposition"] == f'attachment; filename="run-{run_id}-stderr.txt"'
    assert ui.get(f"/ui/runs/{run_id}/log.txt").text == "out\nerr\n"

    log_in(ui, create_api_key(engine, "other"))
    assert ui.get(f"/ui/runs/{run_id}/log.txt").status_code == 404


def test_rerun_button__starts_a_new_run_of_the_same_input(ui: TestClient, engine: Engine):
    run_id = submit(ui, engine, "acme")
    log_in(ui, create_api_key(engine, "acme"))
    page = ui.get(f"/ui/runs/{run_id}").text
    assert 'id="rerun-run"' in page
    token = csrf(ui, f"/ui/runs/{run_id}")
    assert ui.post(f"/ui/runs/{run_id}/rerun", data={}).status_code == 403  # no CSRF token
    done = ui.post(f"/ui/runs/{run_id}/rerun", data={"csrf_token": token})
    assert done.status_code == 303
    new_id = re.fullmatch(
        r"/ui/runs/([0-9a-f-]{36})\?notice=rerun_started", done.headers["location"]
    )
    assert new_id is not None and new_id.group(1) != run_id
    assert "Re-run started" in ui.get(done.headers["location"]).text
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE rerun_of = :id", id=run_id) == 1

    log_in(ui, create_api_key(engine, "other"))
    token = csrf(ui, "/ui/runs")
    assert ui.post(f"/ui/runs/{run_id}/rerun", data={"csrf_token": token}).status_code == 404
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE rerun_of = :id", id=run_id) == 1


def test_submit_form__has_fields_from_the_schema_and_errors_by_field(
    ui: TestClient, engine: Engine
):
    log_in(ui, create_api_key(engine, "acme"))
    form = ui.get("/ui/submit?tool=sleep").text
    assert 'id="f-sleep-seconds"' in form and 'name="field.seconds"' in form
    assert '<span class="visually-hidden">(required)</span>' in form
    assert 'id="input"' in form  # the raw JSON box stays
    token = csrf(ui, "/ui/submit?tool=sleep")
    base = {"csrf_token": token, "tool": "sleep", "input": "{}", "input_from": "fields"}

    bad = ui.post("/ui/submit", data={**base, "field.seconds": "lots", "form_key": "k" * 16})
    assert bad.status_code == 422
    assert 'id="f-sleep-seconds-error"' in bad.text and "must be a number" in bad.text
    assert 'value="lots"' in bad.text  # the form keeps what was typed
    too_long = ui.post("/ui/submit", data={**base, "field.seconds": "7200", "form_key": "l" * 16})
    assert "7200 is greater than the maximum of 3600" in too_long.text
    missing = ui.post("/ui/submit", data={**base, "field.seconds": "", "form_key": "m" * 16})
    assert "seconds is required" in missing.text
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0

    # Raw JSON that breaks the schema is shown on the fields too.
    raw = {**base, "input_from": "json", "input": '{"seconds": -1}', "form_key": "n" * 16}
    wrong = ui.post("/ui/submit", data=raw)
    assert wrong.status_code == 422 and 'id="json-field-errors"' in wrong.text
    assert 'id="f-sleep-seconds-error"' in wrong.text and 'value="-1"' in wrong.text

    ok = ui.post("/ui/submit", data={**base, "field.seconds": "0.5", "form_key": "o" * 16})
    assert ok.status_code == 303
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT input FROM tool_runs")).scalar_one()
    assert stored == {"seconds": 0.5}


def test_theme__the_toggle_sets_a_cookie_the_pages_follow(ui: TestClient, engine: Engine):
    log_in(ui, create_api_key(engine, "acme"))
    assert "data-theme" not in ui.get("/ui/runs").text.split(">", 2)[1]  # auto: the system's
    chosen = ui.post("/ui/theme", data={"theme": "dark", "back": "/ui/queue?x=1"})
    assert chosen.status_code == 303 and chosen.headers["location"] == "/ui/queue?x=1"
    assert "runyard_theme=dark" in chosen.headers["set-cookie"]
    assert '<html lang="en" data-theme="dark">' in ui.get("/ui/queue").text
    away = ui.post("/ui/theme", data={"theme": "auto", "back": "https://elsewhere.example/"})
    assert away.headers["location"] == "/ui/runs"  # never off the dashboard
    assert 'data-theme="dark"' not in ui.get("/ui/runs").text
    forged = ui.post("/ui/theme", data={"theme": "dark"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert forged.status_code == 403


def test_run_page__a_run_started_while_the_page_is_read_still_reaches_it_live(
    ui: TestClient, engine: Engine, queue: JobQueue, monkeypatch: pytest.MonkeyPatch
):
    """The page streams the events after its ``upto``: a start committed while the page is
    being read is either shown or left for the stream, never skipped by both."""
    run_id = submit(ui, engine, "acme")

    def started_meanwhile(bind: Engine, run: uuid.UUID) -> LogSnapshot:
        queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
        return log_snapshot(bind, run)

    monkeypatch.setattr(views, "log_snapshot", started_meanwhile)
    log_in(ui, create_api_key(engine, "acme"))
    page = ui.get(f"/ui/runs/{run_id}").text
    with engine.connect() as conn:
        started = conn.execute(
            text(
                "SELECT id FROM tool_run_events WHERE run_id = :id AND type = 'status'"
                " AND data->>'status' = 'running'"
            ),
            {"id": run_id},
        ).scalar_one()
    upto = int(re.search(r'data-upto="(\d+)"', page).group(1))  # type: ignore[union-attr]
    shown = re.search(r'id="run-status"[^>]*data-status="(\w+)"', page)
    # The stream would begin after the start's event: the page itself must show it.
    assert upto >= started
    assert shown is not None and shown.group(1) == "running"
