"""Browser fixtures: Debian's headless Chromium (driven by Playwright), the API served on
loopback, and a real worker process on the real Docker engine."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Request,
    Response,
    expect,
    sync_playwright,
)
from sqlalchemy import Engine, text

from runyard.platform.settings import Settings
from runyard.registry.tools import load_registry
from runyard.runners.docker.labels import LABEL_MANAGED
from tests.acceptance.cluster import FAST_TIMINGS
from tests.integration.api.test_api_helpers import live_server, make_app
from tests.integration.conftest import _quietly

ROOT = Path(__file__).resolve().parents[2]
# Screenshots are test artefacts (git-ignored), one per page and width.
EXPECTED_404 = "Failed to load resource: the server responded with a status of 404"
ARTIFACTS = Path(os.environ.get("RUNYARD_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "ui"


def chromium_executable() -> str:
    """Debian's Chromium; scripts/test installs it (scripts/ensure-chromium)."""
    configured = os.environ.get("RUNYARD_TEST_CHROMIUM")
    found = configured or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("no Chromium: run scripts/ensure-chromium (Debian package 'chromium')")
    return found


# An expectation's wait: a page that loads within it passes. Playwright's 5 s default was
# too short for the first page of a freshly started API while a worker, Chromium and two
# other tests start beside it on a 2-core machine (a login's redirect was seen to take longer).
EXPECT_SECONDS = 20


@pytest.fixture(autouse=True, scope="session")
def _patient_expectations() -> None:
    expect.set_options(timeout=EXPECT_SECONDS * 1000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium per module: Playwright's sync API keeps an event loop running in
    the main thread while it is open, which later asyncio tests must not find."""
    args = ["--disable-dev-shm-usage"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses its sandbox as root (CI runs as root)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_executable(), args=args)
        yield launched
        launched.close()


@dataclass
class Dashboard:
    """The API on loopback and what the pages asked of the network."""

    url: str
    engine: Engine
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    expected_404: set[str] = field(default_factory=set)
    # Every answer that was not a 2xx, in order ("303 POST /ui/login"): last in the repr
    # pytest prints of a failed test, it says what a page that never showed got instead.
    not_ok: list[str] = field(default_factory=list)

    def expect_404(self, path: str) -> str:
        """Note a page the test opens expecting 404; returns the path."""
        self.expected_404.add(self.url + path)
        return path

    def context(self, browser: Browser, width: int = 1280) -> BrowserContext:
        """A fresh browser profile whose every request and console error is recorded."""
        made = browser.new_context(viewport={"width": width, "height": 900}, base_url=self.url)

        def on_console(message: ConsoleMessage) -> None:
            # A 404 the test opened on purpose logs this; anything else is a fault (a script
            # error, a missing asset, a request the Content-Security-Policy blocked).
            if message.type != "error":
                return
            expected = message.text.startswith(EXPECTED_404) and (
                message.location.get("url") in self.expected_404
            )
            if not expected:
                self.console_errors.append(f"{message.text} ({message.location.get('url')})")

        def on_page(page: Page) -> None:
            page.on("console", on_console)
            page.on("pageerror", lambda error: self.console_errors.append(str(error)))

        def on_request(request: Request) -> None:
            self.requests.append(request.url)

        def on_response(response: Response) -> None:
            if not 200 <= response.status < 300:
                path = response.url.removeprefix(self.url)
                self.not_ok.append(f"{response.status} {response.request.method} {path}")

        made.on("request", on_request)
        made.on("response", on_response)
        made.on("page", on_page)
        return made

    def foreign_requests(self) -> list[str]:
        """Requests that went anywhere but the API's own origin."""
        return [url for url in self.requests if not url.startswith(self.url + "/")]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the test, so a fixture's teardown can see a failure."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "report_call", None)
    return report is not None and report.failed


def _diagnose(engine: Engine, worker: subprocess.Popen[bytes], log_path: Path) -> None:
    """After a failure: the worker's thread stacks and what its database was waiting on."""
    worker.send_signal(signal.SIGUSR1)
    time.sleep(1)
    with engine.connect() as conn:
        activity = conn.execute(text(DIAGNOSE_ACTIVITY)).all()
    out = ["== database sessions of the test (pid, state, waiting on, open for, blocked by, query)"]
    out += [" | ".join(str(value) for value in row) for row in activity]
    out.append("== worker log (the last 80 lines that are not sweeps)")
    lines = log_path.read_text(errors="replace").splitlines()
    out += [line for line in lines if "sweep" not in line][-80:]
    sys.stdout.write("\n".join(out) + "\n")  # pytest shows it with the failure


DIAGNOSE_ACTIVITY = """
    SELECT pid, state, wait_event_type || ':' || wait_event, now() - xact_start,
           pg_blocking_pids(pid), left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
    FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


@pytest.fixture
def dashboard(
    database_url: str, engine: Engine, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Dashboard]:
    """The API in-process on loopback plus ``python -m worker``; cleaned up after."""
    registry = load_registry(ROOT / "tests" / "tools.toml", Settings(database_url="unused"))
    app = make_app(database_url, engine, registry, events_poll_seconds=0.5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    env.update(FAST_TIMINGS)
    env.update(
        RUNYARD_DATABASE_URL=database_url,
        RUNYARD_TOOLS_FILE=str(ROOT / "tests" / "tools.toml"),
        RUNYARD_WORKER_ID="w-browser",
        RUNYARD_WORKER_CONCURRENCY="2",
    )
    log = (tmp_path / "worker.log").open("ab")
    worker = subprocess.Popen(
        [sys.executable, "-m", "worker"], env=env, stdout=log, stderr=log, cwd=ROOT
    )
    log.close()
    try:
        with live_server(app) as url:
            yield Dashboard(url=url, engine=engine)
    finally:
        if _failed(request):
            _diagnose(engine, worker, tmp_path / "worker.log")
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
        _remove_containers_of(engine)


def _remove_containers_of(engine: Engine) -> None:
    with engine.connect() as conn:
        runs = {str(r) for r in conn.execute(text("SELECT id FROM tool_runs")).scalars()}
    client = docker.from_env(timeout=60)
    label = {"label": f"{LABEL_MANAGED}=true"}
    for container in client.api.containers(all=True, filters=label):
        if (container.get("Labels") or {}).get("io.runyard.run_id") in runs:
            _quietly(functools.partial(client.api.remove_container, container["Id"], force=True))
    for volume in client.api.volumes(filters=label).get("Volumes") or []:
        if (volume.get("Labels") or {}).get("io.runyard.run_id") in runs:
            _quietly(functools.partial(client.api.remove_volume, volume["Name"], force=True))
    client.close()
