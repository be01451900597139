"""The tools page's per-tool figures: runs started in the window, failure rate and median
duration, per tenant, in one statement that reads the window through its index."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, TextClause, text

from runyard.reads.tool_figures import FIGURES_ALL, FIGURES_OF_TENANT, tool_figures
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import make_app
from tests.integration.api.test_queue_charts import add_run
from tests.integration.api.test_ui_http import log_in


def seed(engine: Engine) -> None:
    now = datetime.now(UTC)
    start = now - timedelta(hours=1)
    for seconds, status in ((1, "succeeded"), (2, "succeeded"), (3, "failed"), (9, "timed_out")):
        add_run(
            engine,
            requested=start,
            started=start,
            finished=start + timedelta(seconds=seconds),
            status=status,
        )
    add_run(engine, requested=start, started=start, finished=start, status="cancelled")
    add_run(engine, requested=start, started=start)  # running: counted, not finished
    add_run(engine, requested=now, started=None)  # never started: not counted
    old = now - timedelta(days=2)
    add_run(engine, requested=old, started=old, finished=old, status="failed")  # outside
    add_run(
        engine, tenant="globex", requested=start, started=start, finished=start, status="failed"
    )


def test_tool_figures__runs_failure_rate_and_median_of_the_window(engine: Engine):
    seed(engine)
    figures = tool_figures(engine, "acme")["echo"]
    assert (figures.runs, figures.finished, figures.failed) == (6, 4, 2)
    assert figures.failure_rate == pytest.approx(0.5)
    assert figures.p50_seconds == pytest.approx(2.5)  # of 1, 2, 3, 9 (not the cancelled one)
    assert tool_figures(engine, None)["echo"].runs == 7
    assert tool_figures(engine, "nobody") == {}


@pytest.mark.parametrize("statement", [FIGURES_OF_TENANT, FIGURES_ALL])
def test_tool_figures__read_only_the_window_through_an_index(engine: Engine, statement: TextClause):
    seed(engine)
    with engine.begin() as conn:
        # A month of older runs, so the planner sees what a window leaves out.
        conn.execute(
            text(
                """
                INSERT INTO tool_runs (id, tenant, tool, spec, input, status, requested_at,
                                       started_at, finished_at)
                SELECT gen_random_uuid(), 'acme', 'echo', '{}', '{}', 'succeeded', t, t, t
                FROM (SELECT now() - make_interval(mins => g * 10) AS t
                      FROM generate_series(200, 4500) g) old
                """
            )
        )
        conn.execute(text("ANALYZE tool_runs"))
    with engine.connect() as conn:
        plan = "\n".join(
            conn.execute(
                text("EXPLAIN " + str(statement)), {"window": 86400, "tenant": "acme"}
            ).scalars()
        )
    # An index range on one of the window's two times; never the whole table.
    scan = re.search(r"Index Scan (?:using|on) ix_tool_runs_\w+ .*\n\s+Index Cond: \((.*)\)", plan)
    assert scan is not None, plan
    assert re.search(r"(requested_at|started_at) >= \(now\(\) - '24:00:00'", scan.group(1)), plan
    assert "Seq Scan" not in plan


def test_tools_page__shows_each_tools_figures(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    seed(engine)
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as client:
        log_in(client, create_api_key(engine, "acme"))
        page = client.get("/ui/tools").text
    echo = re.search(r'<dl class="facts tool-figures" id="figures-echo">(.*?)</dl>', page, re.S)
    assert echo is not None
    assert '<dd class="runs">6</dd>' in echo.group(1)
    assert "50%</span> (2 of 4)" in echo.group(1)
    assert '<dd class="p50">2.5 s</dd>' in echo.group(1)
    sleep = re.search(r'id="figures-sleep">(.*?)</dl>', page, re.S)
    assert sleep is not None and '<dd class="runs">0</dd>' in sleep.group(1)
