"""The queue charts' statements against Postgres, and the queue page that draws them."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from api.ui.context import CONTENT_SECURITY_POLICY
from runyard.queue import JobQueue, NewRun
from runyard.reads.dashboard import QueueMinute, queue_activity
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import make_app

NOW = datetime(2026, 11, 26, 10, 30, 20, tzinfo=UTC)
SINCE = datetime(2026, 11, 26, 9, 31, tzinfo=UTC)  # 60 minutes, the last one 10:30


def add_run(
    engine: Engine,
    *,
    queue: str = "default",
    tenant: str = "acme",
    requested: datetime,
    started: datetime | None,
    finished: datetime | None = None,
    status: str = "running",
) -> uuid.UUID:
    """A run of ``queue`` with the given times (written directly, as a worker would have)."""
    new = NewRun(tenant=tenant, tool="echo", spec={"name": "echo"}, input={}, queue=queue)
    run_id = JobQueue(engine).enqueue(new).run_id
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE tool_runs SET requested_at = :r, started_at = :s, finished_at = :f,"
                " status = CAST(:st AS run_status) WHERE id = :id"
            ),
            {"r": requested, "s": started, "f": finished, "st": status, "id": run_id},
        )
    return run_id


def minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def test_queue_activity__starts_finishes_and_waits_per_minute_and_queue(engine: Engine):
    t = NOW - timedelta(minutes=10)  # 10:20:20
    for wait in (1, 2, 3, 4, 10):
        add_run(engine, requested=t - timedelta(seconds=wait), started=t)
    add_run(
        engine,
        queue="slow",
        requested=t - timedelta(minutes=5),
        started=t - timedelta(minutes=4),
        finished=t,
        status="succeeded",
    )
    # Outside the window or never started: not counted.
    add_run(engine, requested=NOW - timedelta(hours=2), started=NOW - timedelta(minutes=61))
    add_run(engine, requested=NOW, started=None)
    add_run(engine, requested=NOW, started=None, finished=NOW, status="cancelled")

    activity = queue_activity(engine, None, now=NOW)
    assert [a.queue for a in activity] == ["default", "slow"]
    default, slow = activity
    assert len(default.minutes) == 60
    assert default.minutes[0].minute == SINCE and default.minutes[-1].minute == minute(NOW)
    at_t = default.minutes[49]
    assert at_t.minute == minute(t) and (at_t.started, at_t.finished) == (5, 0)
    assert at_t.wait_p50 == pytest.approx(3.0)
    assert at_t.wait_p95 == pytest.approx(8.8)  # between 4 and 10, as percentile_cont does
    assert default.minutes[-1] == QueueMinute(minute(NOW), 0, 1, cancelled=1)  # the cancelled one
    assert sum(m.started for m in default.minutes) == 5
    slow_t = [m for m in slow.minutes if m.started or m.finished]
    assert [(m.minute, m.started, m.finished) for m in slow_t] == [
        (minute(t - timedelta(minutes=4)), 1, 0),
        (minute(t), 0, 1),
    ]
    assert slow_t[0].wait_p50 == pytest.approx(60.0)


def test_queue_activity__splits_finished_runs_by_outcome(engine: Engine):
    t = NOW - timedelta(minutes=2)
    for status in ("succeeded", "succeeded", "failed", "timed_out", "cancelled"):
        add_run(engine, requested=t, started=t, finished=t, status=status)
    (default,) = queue_activity(engine, None, now=NOW)
    (busy,) = [m for m in default.minutes if m.finished]
    assert (busy.finished, busy.succeeded, busy.failed, busy.cancelled) == (5, 2, 2, 1)


def test_queue_activity__a_tenant_sees_only_its_runs(engine: Engine):
    t = NOW - timedelta(minutes=1)
    add_run(engine, tenant="acme", requested=t, started=t)
    add_run(engine, tenant="globex", queue="theirs", requested=t, started=t)
    mine = queue_activity(engine, "acme", now=NOW)
    assert [a.queue for a in mine] == ["default"]
    assert sum(m.started for m in mine[0].minutes) == 1
    assert [a.queue for a in queue_activity(engine, None, now=NOW)] == ["default", "theirs"]


def test_queue_page__draws_an_svg_per_queue_inside_the_csp(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    now = datetime.now(UTC)
    add_run(engine, queue="fast", requested=now - timedelta(seconds=3), started=now)
    add_run(engine, queue="q<b>", tenant="globex", requested=now, started=now)
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as client:
        login = client.post("/ui/login", data={"api_key": create_api_key(engine, "acme")})
        assert login.status_code == 303
        page = client.get("/ui/queue")
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        svgs = re.findall(r"<svg class=\"chart\".*?</svg>", page.text, re.S)
        assert len(svgs) == 2  # acme's one queue: runs per minute and waits
        assert "Runs started and finished per minute, queue fast" in svgs[0]
        assert "UTC: 1 started</title></rect>" in svgs[0]
        assert '<circle class="dot p50"' in svgs[1]
        assert "q&lt;b&gt;" not in page.text  # globex's queue is not acme's business
        assert "<script" not in "".join(svgs) and "style=" not in "".join(svgs)

        client.cookies.clear()
        client.post("/ui/login", data={"api_key": create_api_key(engine, "ops", admin=True)})
        everyone = client.get("/ui/queue").text
        assert len(re.findall(r"<svg class=\"chart\"", everyone)) == 4
        assert "queue q&lt;b&gt;" in everyone and "queue q<b>" not in everyone


def test_queue_page__a_quiet_hour_says_so(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as client:
        client.post("/ui/login", data={"api_key": create_api_key(engine, "acme")})
        page = client.get("/ui/queue").text
        assert "No run started or finished in the last hour." in page
        assert "<svg" not in page.split("<main", 1)[1]
