"""The dashboard in headless Chromium against the real API, a real worker and real Docker."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import text

from runyard.queue import JobQueue
from runyard.tenancy.auth import create_api_key
from tests.browser.conftest import ARTIFACTS, Dashboard
from tests.integration.api.test_api_helpers import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(240)]

LIVE = 60_000  # ms: a run through a real container on a busy 2-core machine


def log_in(page: Page, key: str) -> None:
    """Log in with the keyboard only: the key field has focus, Enter submits."""
    page.goto("/ui/runs")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=/ui/runs$"))
    expect(page.locator("#api_key")).to_be_focused()
    page.keyboard.type(key)
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/ui/runs$"))


def submit_from_form(page: Page, tool: str, value: str) -> str:
    """Submit a run of ``tool`` through the form; the page lands on the run's page."""
    page.goto(f"/ui/submit?tool={tool}")
    page.get_by_label("Input (JSON)").fill(value)
    page.get_by_role("button", name="Submit").click()
    expect(page).to_have_url(re.compile(r"/ui/runs/[0-9a-f-]{36}$"))
    return page.url.rsplit("/", 1)[1]


def assert_same_origin_only(dashboard: Dashboard) -> None:
    """No page asked anything of another origin, and the CSP blocked nothing."""
    assert dashboard.requests, "no request was recorded"
    assert dashboard.foreign_requests() == []
    assert dashboard.console_errors == []


def mark_page(page: Page) -> None:
    """A marker a reload or navigation would wipe."""
    page.evaluate("window.__noReload = true")


def still_marked(page: Page) -> bool:
    return bool(page.evaluate("window.__noReload === true"))


def test_echo_from_the_form__reaches_succeeded_live_then_shows_result_and_logs(
    browser: Browser, dashboard: Dashboard
):
    context = dashboard.context(browser)
    page = context.new_page()
    log_in(page, create_api_key(dashboard.engine, "acme"))

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Submit").click()
    page.get_by_label("Tool").select_option("echo")
    page.get_by_label("Input (JSON)").fill('{"greeting": "hello from the browser"}')
    page.get_by_role("button", name="Submit").click()
    expect(page).to_have_url(re.compile(r"/ui/runs/[0-9a-f-]{36}$"))
    run_id = page.url.rsplit("/", 1)[1]
    mark_page(page)

    # The page follows the run over SSE: queued/running, then succeeded, without a reload.
    expect(page.locator("#run-status")).to_have_attribute("data-status", "succeeded", timeout=LIVE)
    assert still_marked(page)
    expect(page.locator("#run-result")).to_contain_text('"greeting": "hello from the browser"')
    expect(page.locator("#stdout")).to_contain_text('{"greeting": "hello from the browser"}')
    expect(page.locator("#run-exit-code")).to_have_text("0")
    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text("Claimed")
    expect(timeline).to_contain_text("worker id: w-browser")
    expect(timeline).to_contain_text("Status: succeeded")

    # The runs list shows it; opening it shows the result and the logs.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs").click()
    row = page.locator(f'tr[data-run="{run_id}"]')
    expect(row).to_contain_text("succeeded")
    row.get_by_role("link").click()
    expect(page).to_have_url(re.compile(f"/ui/runs/{run_id}$"))
    expect(page.locator("#run-result")).to_contain_text("hello from the browser")
    expect(page.locator("#stdout")).to_contain_text("hello from the browser")
    context.close()
    assert_same_origin_only(dashboard)


def test_runs_list__updates_statuses_in_place(browser: Browser, dashboard: Dashboard):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    mark_page(page)
    response = context.request.post(
        "/v1/runs",
        data={"tool": "sleep", "input": {"seconds": 1}},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status == 202
    run_id = response.json()["id"]
    row = page.locator(f'tr[data-run="{run_id}"]')
    expect(row).to_be_visible(timeout=10_000)
    expect(row.locator(".status")).to_have_text("succeeded", timeout=LIVE)
    assert still_marked(page)
    context.close()
    assert_same_origin_only(dashboard)


def test_run_page__a_failed_panel_read_is_tried_again(browser: Browser, dashboard: Dashboard):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    # Every read of the status panel fails (a busy server's 503) until the run is running.
    failing = [True]
    page.route(
        re.compile(r"/ui/runs/[0-9a-f-]{36}/panel$"),
        lambda route: route.fulfill(status=503, body="busy") if failing[0] else route.continue_(),
    )
    # Due in a few seconds: the page is shown while the run is still queued (on two slow,
    # busy cores its first render came after a run due in four seconds had started).
    run_at = datetime.now(UTC) + timedelta(seconds=12)
    response = context.request.post(
        "/v1/runs",
        data={"tool": "sleep", "input": {"seconds": 120}, "run_at": run_at.isoformat()},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status == 202
    run_id = response.json()["id"]
    page.goto(f"/ui/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "queued")

    def running() -> bool:
        with dashboard.engine.connect() as conn:
            status = conn.execute(
                text("SELECT status FROM tool_runs WHERE id = :id"), {"id": run_id}
            ).scalar_one()
        return bool(status == "running")

    wait_until(running, timeout=LIVE / 1000)
    expect(page.locator("#stdout")).to_contain_text("sleeping 120", timeout=LIVE)
    # The reads that failed are tried again: no further event is needed to show the status.
    failing[0] = False
    expect(page.locator("#run-status")).to_have_attribute("data-status", "running", timeout=LIVE)
    context.close()


def test_cancel__a_sleep_run_from_its_page_ends_cancelled(browser: Browser, dashboard: Dashboard):
    context = dashboard.context(browser)
    page = context.new_page()
    log_in(page, create_api_key(dashboard.engine, "acme"))
    run_id = submit_from_form(page, "sleep", '{"seconds": 120}')

    # Running, with its first line tailed live from the container.
    expect(page.locator("#run-status")).to_have_attribute("data-status", "running", timeout=LIVE)
    expect(page.locator("#stdout")).to_contain_text("sleeping 120", timeout=LIVE)
    expect(page.locator("#run-holder")).to_contain_text("w-browser")
    # The button asks first; dismissing changes nothing.
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status")).to_have_attribute("data-status", "running")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".notice")).to_contain_text("Cancel requested")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "cancelled", timeout=LIVE)
    expect(page.locator("#timeline")).to_contain_text("Cancel requested")
    expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)
    with dashboard.engine.connect() as conn:
        status = conn.execute(
            text("SELECT CAST(status AS text) FROM tool_runs WHERE id = :id"), {"id": run_id}
        ).scalar_one()
    assert status == "cancelled"
    context.close()
    assert_same_origin_only(dashboard)


def test_tenancy__another_tenant_cannot_open_the_run_page(browser: Browser, dashboard: Dashboard):
    owner = dashboard.context(browser)
    page = owner.new_page()
    log_in(page, create_api_key(dashboard.engine, "acme"))
    submit_from_form(page, "echo", '{"secret": "acme-only-7f3a"}')
    expect(page.locator("body")).to_contain_text("acme-only-7f3a")
    run_path = dashboard.expect_404(page.url.removeprefix(dashboard.url))

    other = dashboard.context(browser)
    intruder = other.new_page()
    log_in(intruder, create_api_key(dashboard.engine, "globex"))
    response = intruder.goto(run_path)
    assert response is not None and response.status == 404
    expect(intruder.get_by_role("heading", name="Not found")).to_be_visible()
    expect(intruder.locator("body")).not_to_contain_text("acme-only-7f3a")
    for suffix in ("/panel", "/details", "/logs", "/log.txt"):
        fragment = intruder.request.get(run_path + suffix)
        assert fragment.status == 404 and "acme-only-7f3a" not in fragment.text()
    intruder.goto("/ui/runs")
    expect(intruder.locator("#run-rows")).not_to_contain_text(run_path.rsplit("/", 1)[1][:8])
    owner.close()
    other.close()
    assert_same_origin_only(dashboard)


def test_requeue__the_page_switches_to_the_new_attempts_logs(
    browser: Browser, dashboard: Dashboard
):
    context = dashboard.context(browser)
    page = context.new_page()
    log_in(page, create_api_key(dashboard.engine, "acme"))
    run_id = submit_from_form(page, "sleep", '{"seconds": 120}')
    expect(page.locator("#stdout")).to_have_text("sleeping 120\n", timeout=LIVE)
    mark_page(page)

    # Take the lease away as the reaper would after a lost heartbeat, with the live token.
    with dashboard.engine.connect() as conn:
        job_id, token = conn.execute(
            text("SELECT id, lease_token FROM tool_run_jobs WHERE run_id = :id"), {"id": run_id}
        ).one()
    queue = JobQueue(dashboard.engine)
    assert queue.requeue(job_id, token, error_code="test", error="forced requeue").owned

    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text("Requeued", timeout=LIVE)
    expect(page.locator("#run-panel")).to_contain_text("2 of 3", timeout=LIVE)
    expect(page.locator("#run-status")).to_have_attribute("data-status", "running", timeout=LIVE)
    # Once attempt 2 has printed, the pane holds its output only (not appended to the first's).
    wait_until(lambda: second_attempt_printed(dashboard, run_id), timeout=60)
    expect(page.locator("#stdout")).to_have_text("sleeping 120\n")
    expect(timeline.locator("li", has_text="Claimed")).to_have_count(2)
    assert still_marked(page)
    queue.cancel(uuid.UUID(run_id))
    expect(page.locator("#run-status")).to_have_attribute("data-status", "cancelled", timeout=LIVE)
    context.close()
    assert_same_origin_only(dashboard)


def second_attempt_printed(dashboard: Dashboard, run_id: str) -> bool:
    with dashboard.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM tool_run_events WHERE run_id = :id AND type = 'stdout'"
                    " AND data->>'attempt' = '2'"
                ),
                {"id": run_id},
            ).scalar_one()
        )


def test_batch_page__follows_the_batch_live_and_links_its_runs(
    browser: Browser, dashboard: Dashboard
):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    response = context.request.post(
        "/v1/batches",
        data={
            "runs": [
                {"ref": "first", "tool": "echo", "input": {"step": 1}},
                {"ref": "then", "tool": "sleep", "input": {"seconds": 1}, "depends_on": ["first"]},
            ]
        },
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status == 202, response.text()
    batch = response.json()
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Batches").click()
    expect(page.locator(f'tr[data-batch="{batch["id"]}"]')).to_be_visible()
    page.locator(f'tr[data-batch="{batch["id"]}"] a').click()
    expect(page).to_have_url(re.compile(rf"/ui/batches/{batch['id']}$"))
    mark_page(page)
    nodes = page.locator("svg.graph a.node")
    expect(nodes).to_have_count(2)
    expect(page.locator("svg.graph path.edge")).to_have_count(1)
    # The fragment is re-fetched until the batch ends: both nodes turn green in place.
    expect(page.locator("#batch-summary")).to_have_attribute(
        "data-status", "succeeded", timeout=LIVE
    )
    for ref in ("first", "then"):
        expect(page.locator(f'svg.graph a.node[data-ref="{ref}"]')).to_have_class(
            "node s-succeeded"
        )
    expect(page.locator("svg.graph path.edge")).to_have_class("edge met")
    expect(page.locator("#batch-counts")).to_contain_text("2 succeeded")
    expect(page.locator(".rel").first).to_have_text(re.compile(r"\(.* ago\)"))
    assert still_marked(page)
    page.screenshot(path=ARTIFACTS / "batch-1280.png", full_page=True)
    assert_fits(page, 1280)
    page.set_viewport_size({"width": 390, "height": 900})
    page.screenshot(path=ARTIFACTS / "batch-390.png", full_page=True)
    assert_fits(page, 390)
    page.set_viewport_size({"width": 1280, "height": 900})
    # A node is a link to its run, whose page links back to the batch.
    page.locator('svg.graph a.node[data-ref="then"]').click()
    expect(page).to_have_url(re.compile(rf"/ui/runs/{batch['run_ids']['then']}$"))
    expect(page.locator("#run-batch")).to_contain_text(batch["id"])
    expect(page.locator("#run-depends-on")).to_contain_text("first")
    page.locator("#run-ref").click()
    expect(page).to_have_url(re.compile(rf"/ui/batches/{batch['id']}#ref-then$"))
    context.close()
    assert_same_origin_only(dashboard)


PAGES = {
    "runs": "/ui/runs",
    "batches": "/ui/batches",
    "submit": "/ui/submit?tool=echo",
    "queue": "/ui/queue",
    "workers": "/ui/workers",
    "tools": "/ui/tools",
}


@pytest.mark.parametrize("width", [1280, 390])
def test_screenshots__every_page_fits_the_width(browser: Browser, dashboard: Dashboard, width: int):
    key = create_api_key(dashboard.engine, "ops", admin=True)  # admins also see workers
    context = dashboard.context(browser, width=width)
    page = context.new_page()
    page.goto("/ui/login")
    page.screenshot(path=ARTIFACTS / f"login-{width}.png", full_page=True)
    log_in(page, key)
    for tool, value in (("echo", '{"greeting": "hi"}'), ("fail", "{}")):
        submit_from_form(page, tool, value)
        expect(page.locator("#run-status")).to_have_attribute(
            "data-status", re.compile("succeeded|failed"), timeout=LIVE
        )
        page.screenshot(path=ARTIFACTS / f"run-{tool}-{width}.png", full_page=True)
        assert_fits(page, width)
    for name, path in PAGES.items():
        page.goto(path)
        expect(page.locator("h1")).to_be_visible()
        page.screenshot(path=ARTIFACTS / f"{name}-{width}.png", full_page=True)
        assert_fits(page, width)
    page.goto(dashboard.expect_404("/ui/runs/00000000-0000-4000-8000-000000000000"))
    page.screenshot(path=ARTIFACTS / f"not-found-{width}.png", full_page=True)
    context.close()
    assert_same_origin_only(dashboard)


def assert_fits(page: Page, width: int) -> None:
    """The page itself never scrolls sideways (wide tables scroll inside their box)."""
    scroll_width = page.evaluate("document.documentElement.scrollWidth")
    assert scroll_width <= width, f"{page.url}: {scroll_width} px wide at {width} px"
