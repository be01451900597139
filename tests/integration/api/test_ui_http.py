"""The dashboard over plain HTTP: sessions, CSRF, tenancy, bad input, pages, headers."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from starlette.websockets import WebSocketDisconnect

from api.ui.context import CONTENT_SECURITY_POLICY
from api.ui.session import COOKIE_NAME
from runyard.queue import JobQueue
from runyard.queue.workers import WorkerRegistry
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import bearer, count, make_app, run_status

MISSING = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def app_client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    app = make_app(database_url, engine, registry)
    with TestClient(app, follow_redirects=False) as client:
        yield client


def log_in(client: TestClient, key: str) -> None:
    response = client.post("/ui/login", data={"api_key": key, "next": "/ui/runs"})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/ui/runs"


def csrf(client: TestClient, path: str = "/ui/submit") -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match is not None
    return match.group(1)


def submit(client: TestClient, engine: Engine, tenant: str) -> str:
    headers = bearer(engine, tenant)
    response = client.post(
        "/v1/runs", json={"tool": "sleep", "input": {"seconds": 5}}, headers=headers
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_login__sets_a_signed_httponly_strict_cookie_without_the_secret(
    app_client: TestClient, engine: Engine
):
    key = create_api_key(engine, "acme")
    response = app_client.post("/ui/login", data={"api_key": key, "next": "/ui/queue"})
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/queue"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert key.split("_", 2)[2] not in cookie
    page = app_client.get("/ui/runs")
    assert page.status_code == 200
    assert "acme" in page.text


def test_login__bad_key_is_401_with_a_message_and_no_cookie(app_client: TestClient, engine: Engine):
    create_api_key(engine, "acme")
    for key, message in (("ry_nope_nope", "unknown or revoked"), ("", "Enter an API key")):
        response = app_client.post("/ui/login", data={"api_key": key})
        assert response.status_code == 401
        assert message in response.text
        assert "set-cookie" not in response.headers
    assert app_client.get("/ui/runs").status_code == 303


def test_login__next_outside_the_dashboard_is_ignored(app_client: TestClient, engine: Engine):
    key = create_api_key(engine, "acme")
    for target in ("https://elsewhere.test/", "//elsewhere.test/ui/", "/v1/runs"):
        response = app_client.post("/ui/login", data={"api_key": key, "next": target})
        assert response.headers["location"] == "/ui/runs", target


def test_no_session__pages_go_to_login_and_fragments_answer_401(app_client: TestClient):
    page = app_client.get("/ui/runs?status=queued")
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/login?next=/ui/runs%3Fstatus%3Dqueued"
    fragment = app_client.get("/ui/runs/rows", headers={"X-Runyard-Fragment": "1"})
    assert fragment.status_code == 401
    stream = app_client.get(f"/ui/runs/{MISSING}/events", headers={"Accept": "text/event-stream"})
    assert stream.status_code == 401
    app_client.cookies.set(COOKIE_NAME, "v1.forged.cookie", path="/ui")
    assert app_client.get("/ui/runs").status_code == 303


def test_run_events__resume_from_last_event_id_not_the_urls_after(
    app_client: TestClient, engine: Engine
):
    run_id = submit(app_client, engine, "acme")
    log_in(app_client, create_api_key(engine, "acme"))
    token = csrf(app_client, f"/ui/runs/{run_id}")
    assert app_client.post(f"/ui/runs/{run_id}/cancel", data={"csrf_token": token}).is_redirect
    with engine.connect() as conn:
        queued, cancelled = conn.execute(
            text("SELECT id FROM tool_run_events WHERE run_id = :id ORDER BY xact_id, id"),
            {"id": run_id},
        ).scalars()
    url = f"/ui/runs/{run_id}/events?after={cancelled}"
    resumed = app_client.get(url, headers={"Last-Event-ID": str(queued)})
    assert resumed.status_code == 200
    assert re.findall(r"^id: (\d+)$", resumed.text, re.M) == [str(cancelled)]
    assert app_client.get(url).status_code == 204


def test_revoked_key__ends_its_sessions_at_once(app_client: TestClient, engine: Engine):
    log_in(app_client, create_api_key(engine, "acme"))
    assert app_client.get("/ui/runs").status_code == 200
    with engine.begin() as conn:
        conn.execute(text("UPDATE api_keys SET revoked_at = now()"))
    assert app_client.get("/ui/runs").status_code == 303


def test_tenancy__another_tenants_run_is_404_on_every_dashboard_route(
    app_client: TestClient, engine: Engine
):
    mine = submit(app_client, engine, "acme")
    theirs = submit(app_client, engine, "globex")
    log_in(app_client, create_api_key(engine, "acme"))
    token = csrf(app_client)

    for path in (
        f"/ui/runs/{theirs}",
        f"/ui/runs/{theirs}/panel",
        f"/ui/runs/{theirs}/details",
        f"/ui/runs/{theirs}/logs",
        f"/ui/runs/{theirs}/log.txt",
    ):
        response = app_client.get(path)
        assert response.status_code == 404, path
        assert theirs in response.text and "no run" in response.text
    assert app_client.get(f"/ui/runs/{theirs}/events").status_code == 404
    assert app_client.get("/ui/runs/not-a-uuid").status_code == 404
    cancel = app_client.post(f"/ui/runs/{theirs}/cancel", data={"csrf_token": token})
    assert cancel.status_code == 404
    assert run_status(engine, theirs) == "queued"

    listing = app_client.get("/ui/runs").text
    assert mine in listing and theirs not in listing
    assert app_client.get(f"/ui/runs/{mine}").status_code == 200

    admin = TestClient(app_client.app, follow_redirects=False)
    log_in(admin, create_api_key(engine, "ops", admin=True))
    listing = admin.get("/ui/runs").text
    assert mine in listing and theirs in listing and "globex" in listing


def test_cancel__needs_the_forms_csrf_token(app_client: TestClient, engine: Engine):
    run_id = submit(app_client, engine, "acme")
    log_in(app_client, create_api_key(engine, "acme"))
    for data in ({}, {"csrf_token": "forged"}):
        refused = app_client.post(f"/ui/runs/{run_id}/cancel", data=data)
        assert refused.status_code == 403
        assert "Reload the page" in refused.text
    assert run_status(engine, run_id) == "queued"

    token = csrf(app_client, f"/ui/runs/{run_id}")
    done = app_client.post(f"/ui/runs/{run_id}/cancel", data={"csrf_token": token})
    assert done.status_code == 303
    assert done.headers["location"] == f"/ui/runs/{run_id}?notice=cancel_requested"
    assert run_status(engine, run_id) == "cancelled"
    again = app_client.post(f"/ui/runs/{run_id}/cancel", data={"csrf_token": token})
    assert again.headers["location"].endswith("notice=already_finished")
    assert "already finished" in app_client.get(again.headers["location"]).text


def test_submit_form__bad_input_is_shown_and_nothing_is_created(
    app_client: TestClient, engine: Engine
):
    log_in(app_client, create_api_key(engine, "acme"))
    token = csrf(app_client)
    cases = (
        ({"tool": "echo", "input": "{not json"}, "not valid JSON"),
        ({"tool": "echo", "input": "[1, NaN]"}, "not valid JSON"),
        ({"tool": "nope", "input": "{}"}, "no tool named"),
        ({"tool": "sleep", "input": '{"seconds": -1}'}, "input.seconds"),
    )
    for data, message in cases:
        response = app_client.post("/ui/submit", data={**data, "csrf_token": token})
        assert response.status_code == 422, data
        assert message in response.text, (data, response.text)
        # The user's text comes back in the form, escaped.
        assert "aria-invalid" in response.text
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0


def test_submit_form__creates_one_run_per_form_even_when_sent_twice(
    app_client: TestClient, engine: Engine
):
    log_in(app_client, create_api_key(engine, "acme"))
    token = csrf(app_client)
    data = {"tool": "echo", "input": '{"greeting": "<b>hi</b>"}', "csrf_token": token}
    first = app_client.post("/ui/submit", data={**data, "form_key": "form-key-0001"})
    second = app_client.post("/ui/submit", data={**data, "form_key": "form-key-0001"})
    assert first.status_code == second.status_code == 303
    assert first.headers["location"] == second.headers["location"]
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE tenant = 'acme'") == 1
    page = app_client.get(first.headers["location"])
    assert page.status_code == 200
    assert "&lt;b&gt;hi&lt;/b&gt;" in page.text and "<b>hi</b>" not in page.text


def test_pages__queue_workers_tools_show_their_figures(app_client: TestClient, engine: Engine):
    mine = submit(app_client, engine, "acme")
    submit(app_client, engine, "acme")
    submit(app_client, engine, "globex")
    # A backoff long enough that the retry still waits when the last page is read.
    queue = JobQueue(engine, backoff_base_seconds=600.0, backoff_max_seconds=600.0)
    [job] = queue.claim(worker_id="w-live", engine_id="engine-a", limit=1, lease_seconds=30)
    assert queue.requeue(job.job_id, job.lease_token, error_code="x", error="retry me").owned
    WorkerRegistry(engine).register("w-live", "engine-a", 4)
    WorkerRegistry(engine).register(
        "w-silent", "engine-a", 2, now=datetime.now(UTC) - timedelta(minutes=10)
    )
    app_client.cookies.clear()
    log_in(app_client, create_api_key(engine, "acme"))

    page = app_client.get("/ui/queue").text
    depth = re.search(r'<table id="depth">.*?</table>', page, re.S)
    assert depth is not None
    rows = re.findall(r"<tr><td>default</td>(.*?)</tr>", depth.group(0), re.S)
    # acme: one ready, one waiting out its backoff; globex's run is not counted.
    assert len(rows) == 2, rows
    assert "ready" in rows[0] and ">1</a>" in rows[0]
    assert "retry backoff" in rows[1] and ">1</a>" in rows[1]
    assert "Runs started in the last 60 min" in page and mine not in page

    # Workers are for admins: hosts, engines and other tenants' load.
    assert app_client.get("/ui/workers").status_code == 403
    assert 'href="/ui/workers"' not in app_client.get("/ui/runs").text
    admin = TestClient(app_client.app, follow_redirects=False)
    log_in(admin, create_api_key(engine, "ops", admin=True))
    workers = admin.get("/ui/workers").text
    assert re.search(r"w-live</td>\s*<td><span class=\"state w-live\">live", workers)
    assert re.search(r"w-silent</td>\s*<td><span class=\"state w-silent\">silent", workers)
    everyone = admin.get("/ui/queue").text
    assert ">2</a>" in everyone  # acme's ready run and globex's

    tools = app_client.get("/ui/tools").text
    for name in ("echo", "sleep", "fail", "shell"):
        assert f'id="tool-{name}"' in tools
    assert "&#34;maximum&#34;: 3600" in tools or "&quot;maximum&quot;: 3600" in tools


def test_timeline__shows_claims_lost_heartbeats_requeues_hand_overs_and_adoptions(
    app_client: TestClient, engine: Engine
):
    run_id = submit(app_client, engine, "acme")
    queue = JobQueue(engine)
    later = datetime.now(UTC) + timedelta(minutes=5)
    [first] = queue.claim(worker_id="w-one", engine_id="engine-a", limit=1, lease_seconds=30)
    assert queue.clear_expired(queue.select_expired(batch=10, now=later), now=later)
    [second] = queue.claim(
        worker_id="w-two", engine_id="engine-a", limit=1, lease_seconds=30, now=later
    )
    assert second.adopted and second.attempt == first.attempt
    assert queue.release(second.job_id, second.lease_token, now=later)
    [third] = queue.claim(
        worker_id="w-three", engine_id="engine-a", limit=1, lease_seconds=30, now=later
    )
    requeued = queue.requeue(
        third.job_id, third.lease_token, error_code="oops", error="x", now=later
    )
    assert requeued.owned
    log_in(app_client, create_api_key(engine, "acme"))

    panel = app_client.get(f"/ui/runs/{run_id}/details").text
    items = re.findall(
        r'<span class="ev-what">(.*?)</span>\s*(?:<span class="ev-details">(.*?)</span>)?', panel
    )
    assert [what for what, _ in items] == [
        "Status: queued",
        "Claimed",
        "Status: running",
        "Heartbeat lost (lease expired)",
        "Adopted by another worker",
        "Released (worker handed over)",
        "Adopted by another worker",
        "Requeued",
        "Status: queued",
    ], items
    details = [detail for _, detail in items]
    assert "worker id: w-one" in details[1] and "worker id: w-two" in details[4]
    assert "worker id: w-three" in details[6]
    assert "engine-a" not in panel and str(third.lease_token) not in panel


def test_headers__dashboard_answers_carry_a_same_origin_csp(app_client: TestClient, engine: Engine):
    for path in ("/ui/login", "/ui/static/app.css"):
        response = app_client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-frame-options"] == "DENY"
    assert "content-security-policy" not in app_client.get("/healthz").headers


def test_guard__dashboard_takes_forms_only_and_the_api_json_only(
    app_client: TestClient, engine: Engine
):
    headers = bearer(engine, "acme")
    as_json = app_client.post("/ui/login", json={"api_key": "x"})
    assert as_json.status_code == 415
    assert "x-www-form-urlencoded" in as_json.json()["detail"]
    as_form = app_client.post("/v1/runs", data={"tool": "echo"}, headers=headers)
    assert as_form.status_code == 415


def test_run_page__names_the_worker_holding_a_running_run_but_no_lease_token(
    app_client: TestClient, engine: Engine
):
    run_id = submit(app_client, engine, "acme")
    log_in(app_client, create_api_key(engine, "acme"))
    assert 'id="run-holder"' not in app_client.get(f"/ui/runs/{run_id}").text  # queued
    [job] = JobQueue(engine).claim(
        worker_id="w-holder", engine_id="engine-a", limit=1, lease_seconds=30
    )
    page = app_client.get(f"/ui/runs/{run_id}").text
    holder = re.search(r'<dd id="run-holder">(.*?)</dd>', page, re.S)
    assert holder is not None and "w-holder" in holder.group(1) and "lease until" in holder.group(1)
    assert str(job.lease_token) not in page
    assert "engine-a" not in page
    timeline = app_client.get(f"/ui/runs/{run_id}/details").text
    assert "Claimed" in timeline and "worker id: w-holder" in timeline


def test_runs_page__filters_and_pages_with_older_links(app_client: TestClient, engine: Engine):
    headers = bearer(engine, "acme")
    ids = []
    for i in range(27):
        tool = "echo" if i % 3 else "fail"
        response = app_client.post("/v1/runs", json={"tool": tool, "input": {}}, headers=headers)
        ids.append(response.json()["id"])
    log_in(app_client, create_api_key(engine, "acme"))

    def shown(html: str) -> list[str]:
        return re.findall(r'<tr data-run="([0-9a-f-]{36})"', html)

    first = app_client.get("/ui/runs").text
    assert shown(first) == list(reversed(ids))[:25]
    older = re.search(r'href="/ui/runs\?(cursor=[^"]+)" rel="next"', first)
    assert older is not None
    second = app_client.get(f"/ui/runs?{older.group(1)}").text
    assert shown(second) == list(reversed(ids))[25:]
    assert 'rel="next"' not in second and "« Newest" in second

    fails = shown(app_client.get("/ui/runs?tool=fail").text)
    assert fails == [run for i, run in reversed(list(enumerate(ids))) if i % 3 == 0]
    assert shown(app_client.get("/ui/runs?status=succeeded").text) == []
    assert len(shown(app_client.get("/ui/runs?status=queued&tool=echo").text)) == 18
    # Junk in the query narrows nothing and breaks nothing.
    junk = app_client.get("/ui/runs?status=bogus&cursor=not-a-cursor")
    assert junk.status_code == 200
    assert shown(junk.text) == shown(first)
    rows = app_client.get("/ui/runs/rows?tool=fail", headers={"X-Runyard-Fragment": "1"})
    assert rows.status_code == 200 and "<html" not in rows.text
    assert shown(rows.text) == fails


def test_forms__from_another_site_are_refused_login_included(
    app_client: TestClient, engine: Engine
):
    key = create_api_key(engine, "acme")
    for headers in (
        {"Origin": "https://elsewhere.test"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://testserver"},
    ):
        refused = app_client.post("/ui/login", data={"api_key": key}, headers=headers)
        assert refused.status_code == 403, headers
        assert "another site" in refused.text
        assert "set-cookie" not in refused.headers
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    assert app_client.post("/ui/login", data={"api_key": key}, headers=same).status_code == 303
    run_id = submit(app_client, engine, "acme")
    token = csrf(app_client)
    cancel = app_client.post(
        f"/ui/runs/{run_id}/cancel",
        data={"csrf_token": token},
        headers={"Origin": "https://elsewhere.test"},
    )
    assert cancel.status_code == 403
    assert run_status(engine, run_id) == "queued"


def test_forms__submit_and_logout_need_the_csrf_token(app_client: TestClient, engine: Engine):
    log_in(app_client, create_api_key(engine, "acme"))
    for data in (
        {"tool": "echo", "input": "{}"},
        {"tool": "echo", "input": "{}", "csrf_token": "x"},
    ):
        assert app_client.post("/ui/submit", data=data).status_code == 403
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0
    assert app_client.post("/ui/logout", data={}).status_code == 403
    assert app_client.get("/ui/runs").status_code == 200  # still logged in
    out = app_client.post("/ui/logout", data={"csrf_token": csrf(app_client)})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login?notice=logged_out"
    assert (
        f"{COOKIE_NAME}=" in out.headers["set-cookie"] and "Max-Age=0" in out.headers["set-cookie"]
    )
    assert app_client.get("/ui/runs").status_code == 303


def test_forms__nul_characters_are_a_clear_400_not_a_crash(app_client: TestClient, engine: Engine):
    create_api_key(engine, "acme")
    login = app_client.post("/ui/login", data={"api_key": "ry_a\x00b_secret"})
    assert login.status_code == 400 and "NUL" in login.text
    junk_key = app_client.post("/ui/login", data={"api_key": "ry_zz-not-hex_secret"})
    assert junk_key.status_code == 401
    log_in(app_client, create_api_key(engine, "acme"))
    token = csrf(app_client)
    data = {"tool": "echo", "input": "{}", "csrf_token": token, "form_key": "a\x00b"}
    assert app_client.post("/ui/submit", data=data).status_code == 400
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0


def test_submit_form__echoes_hostile_input_escaped(app_client: TestClient, engine: Engine):
    log_in(app_client, create_api_key(engine, "acme"))
    hostile = '{"x": </textarea><script>alert(1)</script>'
    response = app_client.post(
        "/ui/submit", data={"tool": "echo", "input": hostile, "csrf_token": csrf(app_client)}
    )
    assert response.status_code == 422
    assert "</textarea><script>" not in response.text
    assert "&lt;/textarea&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in response.text


def test_session__expired_cookie_and_posts_after_expiry_go_to_login(
    app_client: TestClient, engine: Engine
):
    key = create_api_key(engine, "acme")
    run_id = submit(app_client, engine, "acme")
    signer = app_client.app.state.ui.signer  # type: ignore[attr-defined]
    expired = signer.issue(key.split("_")[1], now=time.time() - signer.lifetime_seconds - 1)
    app_client.cookies.set(COOKIE_NAME, expired, path="/ui")
    page = app_client.get(f"/ui/runs/{run_id}")
    assert page.status_code == 303
    assert page.headers["location"] == f"/ui/login?next=/ui/runs/{run_id}"
    post = app_client.post(
        f"/ui/runs/{run_id}/cancel",
        data={"csrf_token": "whatever"},
        headers={"Referer": f"http://testserver/ui/runs/{run_id}"},
    )
    assert post.status_code == 303
    assert post.headers["location"] == f"/ui/login?next=/ui/runs/{run_id}"
    assert run_status(engine, run_id) == "queued"


def test_pages__are_not_cached_and_junk_queries_still_render(
    app_client: TestClient, engine: Engine
):
    log_in(app_client, create_api_key(engine, "acme"))
    assert app_client.get("/ui/runs").headers["cache-control"] == "no-store"
    assert "no-store" not in app_client.get("/ui/static/app.js").headers.get("cache-control", "")
    for query in ("tool=" + "x" * 500, "cursor=" + "y" * 500, "status=" + "z" * 100):
        assert app_client.get(f"/ui/runs?{query}").status_code == 200, query
    assert app_client.get("/ui/submit?tool=" + "t" * 300).status_code == 200


def test_auth_disabled__no_login_everyone_is_the_dev_admin(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, auth_disabled=True)
    with TestClient(app, follow_redirects=False) as client:
        assert client.get("/ui/login").headers["location"] == "/ui/runs"
        page = client.get("/ui/runs")
        assert page.status_code == 200 and "admin" in page.text
        assert client.get("/ui/workers").status_code == 200
        token = csrf(client)
        created = client.post(
            "/ui/submit", data={"tool": "echo", "input": "{}", "csrf_token": token}
        )
        assert created.status_code == 303
        assert client.post("/ui/submit", data={"tool": "echo", "input": "{}"}).status_code == 403
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE tenant = 'dev'") == 1


def terminal_close(client: TestClient, path: str, headers: dict[str, str]) -> tuple[int, str]:
    """The close code and reason the dashboard's terminal answers with."""
    with client.websocket_connect(path, headers=headers) as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
    return closed.value.code, closed.value.reason


def test_sandbox_terminal__refuses_no_session_another_sites_page_and_a_missing_sandbox(
    app_client: TestClient, engine: Engine
):
    # The refusals come before the engine is asked for anything.
    app_client.app.state.sandbox_engine = object  # type: ignore[attr-defined]
    path = f"/ui/sandboxes/{MISSING}/terminal"
    own = {"origin": "http://testserver"}
    assert terminal_close(app_client, path, own) == (4401, "The session ended: log in again.")
    log_in(app_client, create_api_key(engine, "acme"))
    for foreign in ({"origin": "https://evil.example"}, {}):
        code, reason = terminal_close(app_client, path, foreign)
        assert (code, "dashboard's pages" in reason) == (4403, True)
    assert terminal_close(app_client, path, own)[0] == 4404
