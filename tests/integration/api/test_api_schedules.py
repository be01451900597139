"""Schedules over HTTP: create, list, get, pause, resume, delete; bad cadences, tools and
inputs are clear 422s; another tenant's schedule is a 404; runs show their schedule."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.queue import AdmissionCaps
from runyard.registry.tools import ToolRegistry
from runyard.schedules.scheduler import Scheduler, SchedulerConfig
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import bearer, make_app
from tests.integration.api.test_ui_http import log_in


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    app = make_app(database_url, engine, registry, tenant_max_schedules=3)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def acme(engine: Engine) -> dict[str, str]:
    return bearer(engine, "acme")


def create(client: TestClient, headers: dict[str, str], **body: Any) -> Any:
    sent = {"tool": "echo", "input": {"n": 1}, "every_seconds": 60, **body}
    return client.post("/v1/schedules", json=sent, headers=headers)


def test_schedule__create_get_list_pause_resume_delete(client, acme):
    made = create(client, acme, cron="0 9 * * 1-5", every_seconds=None, timezone="Europe/Berlin")
    assert made.status_code == 201, made.text
    body = made.json()
    assert made.headers["Location"] == f"/v1/schedules/{body['id']}"
    assert (body["cron"], body["timezone"], body["catch_up"], body["paused"]) == (
        "0 9 * * 1-5",
        "Europe/Berlin",
        "none",
        False,
    )
    next_slot = datetime.fromisoformat(body["next_slot_at"])
    assert next_slot.astimezone(UTC).minute == 0 and next_slot > datetime.now(UTC)
    assert "tenant" not in body
    url = f"/v1/schedules/{body['id']}"
    assert client.get(url, headers=acme).json() == body
    listed = client.get("/v1/schedules", headers=acme).json()
    assert [item["id"] for item in listed["items"]] == [body["id"]]
    assert client.post(f"{url}/pause", headers=acme).json()["paused"] is True
    resumed = client.post(f"{url}/resume", headers=acme).json()
    assert resumed["paused"] is False and resumed["next_slot_at"] is not None
    assert client.delete(url, headers=acme).status_code == 204
    assert client.get(url, headers=acme).status_code == 404


def test_schedule__list_pages_newest_first(client, acme):
    ids = [create(client, acme).json()["id"] for _ in range(3)]
    first = client.get("/v1/schedules", params={"limit": 2}, headers=acme).json()
    second = client.get(
        "/v1/schedules", params={"limit": 2, "cursor": first["next_cursor"]}, headers=acme
    ).json()
    listed = [item["id"] for item in first["items"] + second["items"]]
    assert listed == ids[::-1] and second["next_cursor"] is None
    bad = client.get("/v1/schedules", params={"cursor": "nope"}, headers=acme)
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cursor"


def test_schedule__another_tenants_schedule_is_not_found(client, acme, engine):
    made = create(client, acme).json()
    other = bearer(engine, "globex")
    url = f"/v1/schedules/{made['id']}"
    for answer in (
        client.get(url, headers=other),
        client.post(f"{url}/pause", headers=other),
        client.post(f"{url}/resume", headers=other),
        client.delete(url, headers=other),
    ):
        assert answer.status_code == 404 and answer.json()["code"] == "schedule_not_found"
    assert client.get("/v1/schedules", headers=other).json()["items"] == []
    assert client.get(url, headers=acme).json()["paused"] is False


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"cron": "61 * * * *", "every_seconds": None}, "invalid_schedule", "cron"),
        ({"cron": "* * *", "every_seconds": None}, "invalid_schedule", "cron"),
        ({"cron": "* * * * *"}, "invalid_schedule", "cron"),
        ({"every_seconds": None}, "invalid_schedule", "cron"),
        ({"timezone": "Mars/Olympus"}, "invalid_schedule", "timezone"),
        ({"end_at": "2020-01-01T00:00:00Z"}, "invalid_schedule", "end_at"),
        ({"tool": "nope"}, "unknown_tool", "tool"),
        ({"tool": "sleep", "input": {"seconds": "x"}}, "invalid_input", "input.seconds"),
        ({"catch_up": "some"}, "validation_error", None),
        ({"every_seconds": 0}, "validation_error", None),
        ({"surprise": 1}, "validation_error", None),
    ],
)
def test_schedule__bad_requests_are_422_naming_the_field(client, acme, body, code, field):
    answer = create(client, acme, **body)
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert problem["code"] == code and problem["detail"]
    if field is not None:
        assert problem["field"] == field


def test_schedule__a_tenant_has_at_most_its_cap(client, acme):
    for _ in range(3):
        assert create(client, acme).status_code == 201
    refused = create(client, acme)
    assert refused.status_code == 409 and refused.json()["code"] == "tenant_schedules_limit"


def test_schedule__its_runs_show_their_schedule_and_slot(client, acme, engine, registry):
    start = datetime.now(UTC) - timedelta(seconds=1)
    made = create(client, acme, every_seconds=3600, start_at=start.isoformat()).json()
    slot = datetime.fromisoformat(made["next_slot_at"])
    scheduler = Scheduler(engine, registry, AdmissionCaps(), SchedulerConfig())
    assert scheduler.run_once(now=slot).fired == 1
    schedule = client.get(f"/v1/schedules/{made['id']}", headers=acme).json()
    run = client.get(f"/v1/runs/{schedule['last_run_id']}", headers=acme).json()
    assert run["schedule_id"] == made["id"]
    assert datetime.fromisoformat(run["schedule_slot"]) == slot
    assert (run["tool"], run["input"], run["status"]) == ("echo", {"n": 1}, "queued")


def test_ui_schedules__lists_the_tenants_own_schedules(client, acme, engine):
    mine = create(client, acme, cron="0 9 * * *", every_seconds=None, timezone="Europe/Berlin")
    theirs = create(client, bearer(engine, "globex")).json()
    client.post(f"/v1/schedules/{mine.json()['id']}/pause", headers=acme)
    client.follow_redirects = False  # the log-in answers a redirect
    log_in(client, create_api_key(engine, "acme"))
    page = client.get("/ui/schedules")
    assert page.status_code == 200
    assert mine.json()["id"] in page.text and theirs["id"] not in page.text
    assert "0 9 * * * (Europe/Berlin)" in page.text and "paused" in page.text
    assert 'href="/ui/schedules" aria-current="page"' in page.text
