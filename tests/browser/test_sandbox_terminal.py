"""The sandbox page's terminal in headless Chromium against the real API, a real worker and
real Docker: typing runs commands in the sandbox, Backspace and Ctrl-C work, the panel says why
it closed and reconnects, and another tenant's session cannot open it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from runyard.tenancy.auth import create_api_key
from tests.browser.conftest import Dashboard
from tests.browser.test_dashboard import LIVE, assert_same_origin_only, log_in
from tests.integration.api.test_api_helpers import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(240)]

OPEN_SOCKET = """path => new Promise(resolve => {
  const socket = new WebSocket(`ws://${location.host}${path}`);
  socket.onclose = event => resolve([event.code, event.reason]);
})"""


def running_sandbox(context: Any, key: str) -> str:
    """A sandbox of the ``sandbox`` tool created over the API, once it runs."""
    auth = {"Authorization": f"Bearer {key}"}
    created = context.request.post("/v1/sandboxes", data={"tool": "sandbox"}, headers=auth)
    assert created.status == 201, created.text()
    sandbox_id = str(created.json()["id"])

    def running() -> bool:
        found = context.request.get(f"/v1/sandboxes/{sandbox_id}", headers=auth).json()
        return bool(found["status"] == "running")

    wait_until(running, timeout=LIVE / 1000, interval=0.2)
    return sandbox_id


def test_terminal__typed_commands_run_in_the_sandbox_and_other_tenants_are_refused(
    browser: Browser, dashboard: Dashboard
):
    context = dashboard.context(browser)
    page = context.new_page()
    key = create_api_key(dashboard.engine, "acme")
    log_in(page, key)
    sandbox_id = running_sandbox(context, key)
    page.goto(f"/ui/sandboxes/{sandbox_id}")
    status = page.locator("#terminal-status")
    expect(status).to_contain_text("Connected", timeout=LIVE)
    output = page.locator("#terminal-output")
    output.click()

    # The command's output is a line of its own (the echoed command line starts with "echo").
    page.keyboard.type("echo hello-from-the-browser")
    page.keyboard.press("Enter")
    expect(output).to_contain_text(re.compile(r"\nhello-from-the-browser"), timeout=LIVE)
    page.keyboard.type("echo abX")
    page.keyboard.press("Backspace")
    page.keyboard.type("c")
    page.keyboard.press("Enter")
    expect(output).to_contain_text(re.compile(r"\nabc"), timeout=LIVE)
    # Ctrl-C interrupts the foreground command, well before its 60 s are up.
    page.keyboard.type("sleep 60")
    page.keyboard.press("Enter")
    page.wait_for_timeout(1000)  # until sleep runs: while the shell edits a line it is a key
    page.keyboard.press("Control+c")
    page.keyboard.type("echo after-the-interrupt")
    page.keyboard.press("Enter")
    expect(output).to_contain_text(re.compile(r"\nafter-the-interrupt"), timeout=30_000)

    page.keyboard.type("exit 3")
    page.keyboard.press("Enter")
    expect(status).to_have_text("The shell exited with code 3.", timeout=LIVE)
    page.get_by_role("button", name="Reconnect").click()
    expect(status).to_contain_text("Connected", timeout=LIVE)
    expect(page.get_by_role("button", name="Reconnect")).to_be_hidden()

    other = dashboard.context(browser)
    stranger = other.new_page()
    log_in(stranger, create_api_key(dashboard.engine, "other"))
    code, reason = stranger.evaluate(OPEN_SOCKET, f"/ui/sandboxes/{sandbox_id}/terminal")
    assert (code, reason) == (4404, f"no sandbox {sandbox_id}")
    other.close()
    context.close()
    assert_same_origin_only(dashboard)
