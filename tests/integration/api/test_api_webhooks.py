"""The API's side of webhooks and retention: tenant webhook settings, callback_url checks at
submit, DELETE /v1/runs/{id}, and a sync-mode API that delivers and prunes by itself."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.registry.tools import ToolRegistry
from runyard.runners.fake import FakeRunner
from runyard.webhooks.urls import MAX_URL_LENGTH
from tests.integration.api.test_api_helpers import bearer, count, make_app, run_status, wait_until
from tests.webhook_receiver import receiver_on


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    app = make_app(database_url, engine, registry, webhook_allow_loopback=True)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def strict(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    """An app with the default destination policy (no private addresses)."""
    with TestClient(make_app(database_url, engine, registry)) as test_client:
        yield test_client


@pytest.fixture
def admin(engine: Engine) -> dict[str, str]:
    return bearer(engine, "ops", admin=True)


@pytest.fixture
def acme(engine: Engine) -> dict[str, str]:
    return bearer(engine, "acme")


def put_webhook(client: TestClient, admin: dict[str, str], **body: Any) -> Any:
    return client.put("/v1/tenants/acme/webhook", json={"url": None, **body}, headers=admin)


def submit(client: TestClient, headers: dict[str, str], **body: Any) -> Any:
    return client.post("/v1/runs", json={"tool": "echo", "input": {}, **body}, headers=headers)


# --- tenant webhook settings ---------------------------------------------------------------


def test_put_webhook__makes_the_secret_once_and_rotates_on_request(
    client: TestClient, admin: dict[str, str], engine: Engine
):
    first = put_webhook(client, admin, url="http://127.0.0.1:9/hook")
    assert first.status_code == 200, first.text
    secret = first.json()["secret"]
    assert secret.startswith("whsec_") and first.json()["url"] == "http://127.0.0.1:9/hook"
    again = put_webhook(client, admin, url=None)
    assert again.json() == {
        **{"tenant": "acme", "url": None, "has_secret": True, "secret": None},
        **{"events": ["run.completed"], "deadline_lead_seconds": 60},
    }
    rotated = put_webhook(client, admin, url=None, rotate_secret=True).json()["secret"]
    assert rotated.startswith("whsec_") and rotated != secret
    shown = client.get("/v1/tenants/acme/webhook", headers=admin)
    assert shown.json() == {
        **{"tenant": "acme", "url": None, "has_secret": True, "secret": None},
        **{"events": ["run.completed"], "deadline_lead_seconds": 60},
    }
    stored = "SELECT count(*) FROM tenant_settings WHERE webhook_secret = :s"
    assert count(engine, stored, s=rotated) == 1


def test_put_webhook__events_and_deadline_lead_are_set_shown_and_kept(
    client: TestClient, admin: dict[str, str]
):
    events = ["run.started", "run.deadline_approaching", "run.completed"]
    made = put_webhook(client, admin, events=events, deadline_lead_seconds=120)
    assert made.status_code == 200, made.text
    assert (made.json()["events"], made.json()["deadline_lead_seconds"]) == (events, 120)
    put_webhook(client, admin, url=None)  # neither given: both kept
    shown = client.get("/v1/tenants/acme/webhook", headers=admin).json()
    assert (shown["events"], shown["deadline_lead_seconds"]) == (events, 120)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": ["run.exploded"]}, "events"),
        ({"events": []}, "events"),
        ({"deadline_lead_seconds": 0}, "deadline_lead_seconds"),
        ({"deadline_lead_seconds": 10**9}, "deadline_lead_seconds"),
    ],
    ids=["unknown-event", "no-event", "zero-lead", "lead-past-a-week"],
)
def test_put_webhook__bad_events_or_lead_are_422_naming_the_field(
    client: TestClient, admin: dict[str, str], body: dict[str, Any], field: str
):
    response = put_webhook(client, admin, **body)
    assert response.status_code == 422, response.text
    assert field in response.text


def test_put_webhook__only_for_admins(client: TestClient, acme: dict[str, str]):
    for response in (
        put_webhook(client, acme, url=None),
        client.get("/v1/tenants/acme/webhook", headers=acme),
    ):
        assert response.status_code == 403
        assert response.json()["code"] == "forbidden"


def test_put_webhook__a_private_default_is_refused_without_the_setting(
    strict: TestClient, admin: dict[str, str]
):
    response = put_webhook(strict, admin, url="http://10.0.0.7/hook")
    assert response.status_code == 422
    assert response.json()["code"] == "callback_url_refused" and response.json()["field"] == "url"


# --- callback_url at submit ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("ftp://127.0.0.1/x", "invalid_callback_url"),
        ("http://user:pw@127.0.0.1/x", "invalid_callback_url"),
        ("http://127.0.0.1/" + "a" * MAX_URL_LENGTH, "validation_error"),
        ("", "validation_error"),
    ],
)
def test_submit__a_bad_callback_url_is_422(
    client: TestClient, acme: dict[str, str], url: str, code: str
):
    response = submit(client, acme, callback_url=url)
    assert response.status_code == 422
    assert response.json()["code"] == code and response.json()["field"] == "callback_url"


@pytest.mark.parametrize(
    ("url", "said", "switch"),
    [
        ("http://127.0.0.1:8080/hook", "127.0.0.1 is a loopback address", "ALLOW_LOOPBACK"),
        ("http://localhost:8080/hook", "localhost is a loopback name", "ALLOW_LOOPBACK"),
        ("https://169.254.169.254/latest", "169.254.169.254 is a link-local", "never allowed"),
        ("http://[::ffff:10.0.0.1]/x", "10.0.0.1 is a private address", "ALLOW_PRIVATE"),
        ("http://[64:ff9b::a9fe:a9fe]/x", "embeds 169.254.169.254", "never allowed"),
    ],
)
def test_submit__a_non_public_destination_is_refused_without_the_setting(
    strict: TestClient, acme: dict[str, str], engine: Engine, url: str, said: str, switch: str
):
    response = submit(strict, acme, callback_url=url)
    assert response.status_code == 422
    problem = response.json()
    assert problem["code"] == "callback_url_refused" and problem["field"] == "callback_url"
    assert said in problem["detail"] and switch in problem["detail"]
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0


def test_submit__private_addresses_do_not_open_loopback_or_metadata(
    database_url: str, engine: Engine, registry: ToolRegistry, acme: dict[str, str]
):
    app = make_app(database_url, engine, registry, webhook_allow_private=True)
    with TestClient(app) as private_only:
        for url in ("http://127.0.0.1:8080/h", "http://169.254.169.254/h"):
            refused = submit(private_only, acme, callback_url=url)
            assert refused.json()["code"] == "callback_url_refused", url


def test_submit__a_name_is_not_resolved_at_submit(
    client: TestClient,
    acme: dict[str, str],
    admin: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
):
    put_webhook(client, admin)

    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the API resolved a callback host")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    # Names are checked at delivery: here neither one that resolves nowhere nor an internal
    # one is looked up, and neither answer would tell the tenant anything.
    for url in ("http://never-answers.invalid/h", "http://db.internal:5432/h"):
        response = submit(client, acme, callback_url=url)
        assert response.status_code == 202, response.text


def test_submit__a_callback_needs_the_tenant_secret_first(
    client: TestClient, acme: dict[str, str], admin: dict[str, str], engine: Engine
):
    refused = submit(client, acme, callback_url="http://127.0.0.1:9/hook")
    assert refused.status_code == 422
    assert refused.json()["code"] == "webhook_secret_missing"
    assert "PUT /v1/tenants/acme/webhook" in refused.json()["detail"]
    put_webhook(client, admin)
    accepted = submit(client, acme, callback_url="http://127.0.0.1:9/hook")
    assert accepted.status_code == 202, accepted.text
    assert "callback_url" not in accepted.json()  # the run resource is unchanged
    stored = count(
        engine,
        "SELECT count(*) FROM tool_runs WHERE id = :id AND callback_url = 'http://127.0.0.1:9/hook'",
        id=accepted.json()["id"],
    )
    assert stored == 1


def test_submit__an_idempotent_retry_with_another_callback_is_a_conflict(
    client: TestClient, acme: dict[str, str], admin: dict[str, str]
):
    put_webhook(client, admin)
    key = {"Idempotency-Key": "k-1"}
    first = submit(client, {**acme, **key}, callback_url="http://127.0.0.1:9/a")
    replay = submit(client, {**acme, **key}, callback_url="http://127.0.0.1:9/a")
    other = submit(client, {**acme, **key}, callback_url="http://127.0.0.1:9/b")
    assert first.status_code == 202 and replay.json()["id"] == first.json()["id"]
    assert other.status_code == 409


# --- callback URLs of a batch --------------------------------------------------------------


def batch(client: TestClient, headers: dict[str, str], urls: list[str], **body: Any) -> Any:
    runs = [{"tool": "echo", "input": {}, "callback_url": url} for url in urls]
    return client.post("/v1/batches", json={"runs": runs, **body}, headers=headers)


def test_batch__more_distinct_callback_urls_than_the_cap_is_422(
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    admin: dict[str, str],
    acme: dict[str, str],
):
    app = make_app(
        database_url, engine, registry, webhook_allow_loopback=True, webhook_batch_max_urls=3
    )
    with TestClient(app) as client:
        put_webhook(client, admin)
        many = batch(client, acme, [f"http://127.0.0.1:9/h{i}" for i in range(3)],
                     callback_url="http://127.0.0.1:9/default")  # fmt: skip
        assert many.status_code == 422
        problem = many.json()
        assert problem["code"] == "too_many_callback_urls"
        assert "4 different callback URLs" in problem["detail"]
        assert "at most 3" in problem["detail"]
        assert count(engine, "SELECT count(*) FROM tool_runs") == 0
        # The same URL on every run is one URL; three distinct ones are within the cap.
        same = batch(client, acme, ["http://127.0.0.1:9/h"] * 200)
        assert same.status_code == 202, same.text
        three = batch(client, acme, ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"],
                      callback_url="http://127.0.0.1:9/c")  # fmt: skip
        assert three.status_code == 202, three.text


def test_batch__a_refused_callback_url_refuses_the_batch(
    strict: TestClient, admin: dict[str, str], acme: dict[str, str], engine: Engine
):
    put_webhook(strict, admin)
    refused = batch(strict, acme, ["https://hooks.example/ok", "http://10.0.0.1/x"])
    assert refused.status_code == 422
    assert refused.json()["code"] == "callback_url_refused"
    assert "10.0.0.1 is a private address" in refused.json()["detail"]
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0


# --- DELETE /v1/runs/{id} ------------------------------------------------------------------


def test_delete_run__only_terminal_runs_of_the_tenant(
    client: TestClient, acme: dict[str, str], engine: Engine
):
    run_id = submit(client, acme).json()["id"]
    busy = client.delete(f"/v1/runs/{run_id}", headers=acme)
    assert busy.status_code == 409
    assert (busy.json()["code"], busy.json()["run_status"]) == ("run_not_finished", "queued")
    assert client.post(f"/v1/runs/{run_id}/cancel", headers=acme).status_code == 202
    other = client.delete(f"/v1/runs/{run_id}", headers=bearer(engine, "globex"))
    assert other.status_code == 404
    deleted = client.delete(f"/v1/runs/{run_id}", headers=acme)
    assert deleted.status_code == 204 and deleted.content == b""
    assert client.get(f"/v1/runs/{run_id}", headers=acme).status_code == 404
    assert client.delete(f"/v1/runs/{run_id}", headers=acme).status_code == 404
    for table in ("tool_runs", "tool_run_jobs", "tool_run_events"):
        assert count(engine, f"SELECT count(*) FROM {table}") == 0
    counts = "SELECT coalesce(sum(queued), 0) + coalesce(sum(running), 0) FROM tenant_run_counts"
    assert count(engine, counts) == 0
    assert client.delete(f"/v1/runs/{uuid.uuid4()}", headers=acme).status_code == 404


def test_delete_run__takes_a_pending_delivery_with_it(
    client: TestClient, acme: dict[str, str], admin: dict[str, str], engine: Engine
):
    put_webhook(client, admin, url="http://127.0.0.1:9/hook")
    run_id = submit(client, acme).json()["id"]
    client.post(f"/v1/runs/{run_id}/cancel", headers=acme)
    assert count(engine, "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'") == 1
    assert client.delete(f"/v1/runs/{run_id}", headers=acme).status_code == 204
    assert count(engine, "SELECT count(*) FROM webhook_deliveries") == 0


# --- sync mode -----------------------------------------------------------------------------


@pytest.mark.slow  # sits out delivery and retention passes
def test_sync_mode__the_api_delivers_and_prunes_by_itself(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(
        database_url,
        engine,
        registry,
        FakeRunner(),
        queue_enabled=False,
        webhook_allow_loopback=True,
        webhook_poll_seconds=0.1,
        retention_days=3 / 86400,
        reaper_interval_seconds=0.2,
    )
    admin, acme = bearer(engine, "ops", admin=True), bearer(engine, "acme")
    with receiver_on() as receiver, TestClient(app) as client:
        secret = put_webhook(client, admin)
        run = submit(client, acme, callback_url=receiver.url)
        assert run.status_code == 200 and run.json()["status"] == "succeeded", run.text
        wait_until(lambda: receiver.received, timeout=20)
        [got] = receiver.received
        body = got.verified(secret.json()["secret"])
        assert body.pop("usage") is None  # the fake runner meters nothing
        assert body == {**run.json(), "event": "run.completed"}
        wait_until(lambda: run_status(engine, run.json()["id"]) is None, timeout=20)
    with engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM webhook_deliveries")).scalar_one()
    assert left == 0
