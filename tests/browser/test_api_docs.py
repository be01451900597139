"""The interactive API docs render in headless Chromium with every other host cut off."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Route, expect
from sqlalchemy import Engine

from runyard.platform.settings import Settings
from runyard.registry.tools import load_registry
from tests.browser.conftest import ARTIFACTS
from tests.integration.api.test_api_helpers import live_server, make_app

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def test_docs__swagger_ui_renders_offline(browser: Browser, database_url: str, engine: Engine):
    registry = load_registry(ROOT / "tests" / "tools.toml", Settings(database_url="unused"))
    app = make_app(database_url, engine, registry)
    foreign: list[str] = []
    errors: list[str] = []
    with live_server(app) as url:

        def only_this_origin(route: Route) -> None:
            if route.request.url.startswith(url + "/"):
                route.continue_()
            else:
                foreign.append(route.request.url)
                route.abort()

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                errors.append(message.text)

        context = browser.new_context(base_url=url, viewport={"width": 1280, "height": 900})
        context.route("**/*", only_this_origin)
        try:
            page = context.new_page()
            page.on("console", on_console)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto("/docs")
            # Swagger UI builds the page from its script and /openapi.json: seconds of a
            # slow core's CPU beside other tests, more than expect's default 5 s.
            expect(page.locator(".swagger-ui .info .title")).to_contain_text(
                "runyard", timeout=30_000
            )
            expect(page.locator(".opblock-summary-path", has_text="/v1/runs").first).to_be_visible()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "api-docs.png"))
            # Expanding an operation shows its schema, rendered from /openapi.json.
            page.locator(".opblock-summary-path", has_text="/v1/runs").first.click()
            expect(page.locator(".opblock-body").first).to_be_visible()
        finally:
            context.close()
    assert foreign == []
    assert errors == []
