"""The dashboard's operator tools in headless Chromium against the real API, a real worker
and real Docker: search and filters kept in the URL, bulk actions asked first and reported,
the run page's logs with times and downloads, and Re-run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from runyard.tenancy.auth import create_api_key
from tests.browser.conftest import Dashboard
from tests.browser.test_dashboard import LIVE, assert_same_origin_only, log_in
from tests.integration.api.test_api_helpers import run_status, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(240)]


def post_run(context: Any, key: str, tool: str, value: Any) -> str:
    response = context.request.post(
        "/v1/runs", data={"tool": tool, "input": value}, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status == 202, response.text()
    return str(response.json()["id"])


def test_search_and_filters__live_in_the_url_and_survive_a_reload(
    browser: Browser, dashboard: Dashboard
):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    wanted = post_run(context, key, "echo", {"word": "needle-4711"})
    failing = post_run(context, key, "fail", {})
    post_run(context, key, "echo", {"word": "hay"})
    wait_until(lambda: run_status(dashboard.engine, failing) == "failed", timeout=LIVE / 1000)

    page.get_by_label("Search").fill("needle-4711")
    page.get_by_label("Search").press("Enter")
    expect(page).to_have_url(re.compile(r"/ui/runs\?q=needle-4711$"))
    rows = page.locator("#run-rows tr[data-run]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run", wanted)
    page.reload()
    expect(page.get_by_label("Search")).to_have_value("needle-4711")
    expect(rows).to_have_count(1)

    # By id prefix, then by tool and status: the failure's row shows its error code.
    page.goto(f"/ui/runs?q={failing[:8]}")
    expect(rows).to_have_count(1)
    page.goto("/ui/runs")
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=failed"))
    expect(page.locator(f'tr[data-run="{failing}"] .error-code')).not_to_be_empty()
    # A date range with nothing in it.
    page.goto("/ui/runs?to=2000-01-01")
    expect(page.get_by_label("to", exact=True)).to_have_value("2000-01-01")
    expect(page.locator("#run-rows")).to_contain_text("No runs match.")
    context.close()
    assert_same_origin_only(dashboard)


def test_bulk_cancel__of_selected_runs_asks_then_reports(browser: Browser, dashboard: Dashboard):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    # The worker has two slots: the finished run first, then two that hold them.
    done = post_run(context, key, "echo", {})
    wait_until(lambda: run_status(dashboard.engine, done) == "succeeded", timeout=LIVE / 1000)
    sleepers = [post_run(context, key, "sleep", {"seconds": 120}) for _ in range(2)]
    page.reload()

    for run_id in [*sleepers, done]:
        page.get_by_label(f"Select run {run_id}").check()
    page.get_by_label("With runs").select_option("cancel")
    page.get_by_role("button", name="Selected…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Cancel 2 runs?")
    expect(page.locator("#bulk-plan")).to_contain_text("1 will be skipped (already finished)")
    assert {run_status(dashboard.engine, run_id) for run_id in sleepers} <= {"queued", "running"}
    page.get_by_role("button", name="Cancel 2 runs").click()
    expect(page.locator("#bulk-report")).to_have_text("2 cancelled, 1 skipped (already finished).")
    for run_id in sleepers:
        expect(page.locator(f'tr[data-run="{run_id}"] .status')).to_have_text(
            "cancelled", timeout=LIVE
        )
    context.close()
    assert_same_origin_only(dashboard)


def test_run_page__logs_with_times_a_download_and_rerun(browser: Browser, dashboard: Dashboard):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    run_id = post_run(context, key, "sleep", {"seconds": 1})
    page.goto(f"/ui/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "succeeded", timeout=LIVE)
    stdout = page.locator("#stdout")
    expect(stdout).to_contain_text("sleeping 1")

    # The logs come before the details, and a line carries its time. When the run ends the
    # page swaps the live panes for the stored logs: a box read mid-swap is none, so read
    # both once the page shows them.
    def boxes() -> tuple[Any, Any] | None:
        stdout_box = stdout.bounding_box()
        timeline_box = page.locator("#timeline").bounding_box()
        return (stdout_box, timeline_box) if stdout_box and timeline_box else None

    stdout_top, timeline_top = wait_until(boxes, timeout=10)
    assert stdout_top["y"] < timeline_top["y"]
    expect(stdout.locator(".chunk[data-time]").first).to_have_attribute(
        "data-time", re.compile(r"^\d\d:\d\d:\d\d$")
    )
    with page.expect_download() as download:
        page.locator("#stdout-download").click()
    saved = download.value
    assert saved.suggested_filename == f"run-{run_id}-stdout.txt"
    assert "sleeping 1" in Path(saved.path()).read_text(encoding="utf-8")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Re-run").click()
    expect(page).to_have_url(re.compile(r"/ui/runs/[0-9a-f-]{36}\?notice=rerun_started$"))
    assert run_id not in page.url
    expect(page.locator(".notice")).to_contain_text("Re-run started")
    expect(page.locator("#run-rerun-of")).to_contain_text(run_id)
    context.close()
    assert_same_origin_only(dashboard)


def test_submit_form__fields_from_the_schema_with_errors_by_field(
    browser: Browser, dashboard: Dashboard
):
    context = dashboard.context(browser)
    page = context.new_page()
    log_in(page, create_api_key(dashboard.engine, "acme"))
    page.goto("/ui/submit")
    page.get_by_label("Tool").select_option("sleep")
    seconds = page.get_by_label("seconds")
    expect(seconds).to_be_visible()  # the script showed the chosen tool's fields
    seconds.fill("9999")
    page.get_by_role("button", name="Run with these fields").click()
    expect(page.locator("#f-sleep-seconds-error")).to_contain_text("maximum of 3600")
    expect(page.get_by_label("seconds")).to_have_attribute("aria-invalid", "true")
    page.get_by_label("seconds").fill("0.2")
    page.get_by_role("button", name="Run with these fields").click()
    expect(page).to_have_url(re.compile(r"/ui/runs/[0-9a-f-]{36}$"))
    expect(page.locator("#run-status")).to_have_attribute("data-status", "succeeded", timeout=LIVE)
    expect(page.locator("#stdout")).to_contain_text("sleeping 0.2")
    context.close()
    # The refused form came back as a 422 page on purpose; the browser logs that status.
    refused = [e for e in dashboard.console_errors if "status of 422" in e and "/ui/submit)" in e]
    assert len(refused) == 1
    dashboard.console_errors.remove(refused[0])
    assert_same_origin_only(dashboard)


# The lowest contrast ratio (WCAG 2) of any visible text on the page against the background
# it is drawn on, with the element that has it.
LOWEST_CONTRAST = """
() => {
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return rgb(getComputedStyle(document.documentElement).backgroundColor).slice(0, 3);
  };
  let worst = { ratio: 99, what: "" };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!node.textContent.trim() || !el || el.closest("svg, .visually-hidden, [hidden]")) continue;
    if (!el.getClientRects().length) continue;
    const a = lum(rgb(getComputedStyle(el).color).slice(0, 3));
    const b = lum(background(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < worst.ratio) worst = { ratio, what: el.outerHTML.slice(0, 120) };
  }
  return worst;
}
"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_themes__the_toggle_is_remembered_and_every_page_keeps_its_contrast(
    browser: Browser, dashboard: Dashboard, scheme: str
):
    key = create_api_key(dashboard.engine, "ops", admin=True)
    context = dashboard.context(browser)
    page = context.new_page()
    log_in(page, key)
    failing = post_run(context, key, "fail", {})
    wait_until(lambda: run_status(dashboard.engine, failing) == "failed", timeout=LIVE / 1000)
    # "auto" follows the system's preference.
    background = "getComputedStyle(document.documentElement).backgroundColor"
    page.emulate_media(color_scheme="dark")
    assert page.evaluate(background) == "rgb(13, 17, 23)"
    page.emulate_media(color_scheme="light")
    assert page.evaluate(background) == "rgb(246, 247, 249)"
    # The toggle: auto -> dark -> light, each remembered across pages.
    page.get_by_role("button", name="Theme: auto").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    if scheme == "light":
        page.get_by_role("button", name="Theme: dark").click()
        expect(page.locator("html")).to_have_attribute("data-theme", "light")
    expect(page).to_have_url(re.compile(r"/ui/runs$"))
    for path in (
        "/ui/runs",
        f"/ui/runs/{failing}",
        "/ui/batches",
        "/ui/submit?tool=sleep",
        "/ui/queue",
        "/ui/workers",
        "/ui/tools",
        "/ui/builds",
        "/ui/schedules",
    ):
        page.goto(path)
        expect(page.locator("html")).to_have_attribute("data-theme", scheme)
        worst = page.evaluate(LOWEST_CONTRAST)
        assert worst["ratio"] >= 4.5, (path, worst)
    context.close()
    assert_same_origin_only(dashboard)


def test_tools_and_queue__figures_and_charts_split_failures_from_successes(
    browser: Browser, dashboard: Dashboard
):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    runs = [post_run(context, key, "fail", {}), post_run(context, key, "echo", {"n": 1})]
    ended = ("failed", "succeeded")
    wait_until(
        lambda: all(run_status(dashboard.engine, run_id) in ended for run_id in runs),
        timeout=LIVE / 1000,
    )
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Tools").click()
    expect(page.locator("#figures-fail .runs")).to_have_text("1")
    expect(page.locator("#figures-fail .failure-rate")).to_contain_text("100% (1 of 1)")
    expect(page.locator("#figures-echo .failure-rate")).to_contain_text("0% (0 of 1)")
    expect(page.locator("#figures-echo .p50")).not_to_have_text("—")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Queue").click()
    expect(page.locator("svg.chart rect.bar.failed")).to_have_count(1)
    expect(page.locator("svg.chart rect.bar.succeeded")).to_have_count(1)
    expect(page.locator("svg.chart rect.bar.failed title")).to_contain_text("1 failed")
    context.close()
    assert_same_origin_only(dashboard)
