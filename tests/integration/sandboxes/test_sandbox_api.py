"""The sandbox routes without an engine: who may see a sandbox, what counts against a
tenant's quotas, and the requests they refuse (a sandbox no worker took stays queued)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.domain.sandboxes import MAX_EXECS_TOTAL
from runyard.registry.tools import ToolRegistry
from runyard.runners.fake import FakeRunner
from runyard.sandboxes.store import SandboxStore
from tests.integration.api.test_api_helpers import bearer, make_app


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry)) as test_client:
        yield test_client


def create(client: TestClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/sandboxes", json={"tool": "sandbox", **body}, headers=headers)
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()
    return found


def test_another_tenant__gets_404_on_every_sandbox_route(client: TestClient, engine: Engine):
    acme, other = bearer(engine, "acme"), bearer(engine, "other")
    sid = create(client, acme)["id"]
    exec_id = client.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]}, headers=acme
    ).json()["id"]
    base = f"/v1/sandboxes/{sid}"

    answers = [
        client.get(base, headers=other),
        client.delete(base, headers=other),
        client.post(f"{base}/exec", json={"command": ["true"]}, headers=other),
        client.get(f"{base}/execs/{exec_id}", headers=other),
        client.get(f"{base}/execs/{exec_id}/events", headers=other),
        client.put(f"{base}/files/a.txt", content=b"x", headers=other),
        client.get(f"{base}/files/a.txt", headers=other),
    ]

    assert [a.status_code for a in answers] == [404] * len(answers)
    assert {a.json()["code"] for a in answers} == {"sandbox_not_found", "exec_not_found"}
    assert client.get("/v1/sandboxes", headers=other).json() == {"sandboxes": []}
    assert client.get(base, headers=acme).json()["status"] == "starting"
    not_yet = client.get(f"{base}/files/a.txt", headers=acme)
    assert not_yet.status_code == 409 and not_yet.json()["code"] == "sandbox_not_running"


def test_create__answers_the_sandbox_queued_with_its_settings(client: TestClient, engine: Engine):
    acme = bearer(engine, "acme")

    sandbox = create(client, acme, ttl_seconds=120, idle_timeout_seconds=30, max_execs=2)

    assert sandbox["status"] == "starting" and sandbox["end_reason"] is None
    assert sandbox["tool"] == "sandbox"
    assert (sandbox["idle_timeout_seconds"], sandbox["max_execs"]) == (30, 2)
    pending = client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec", json={"command": ["ls"]}, headers=acme
    ).json()
    assert pending["status"] == "pending" and pending["cwd"] == "/runyard/out/workspace"


def test_quotas__count_sandboxes_like_runs(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, tenant_max_queued=1)
    acme = bearer(engine, "acme")
    with TestClient(app) as client:
        create(client, acme)

        second = client.post("/v1/sandboxes", json={"tool": "sandbox"}, headers=acme)
        run = client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=acme)

    assert second.status_code == 429 and second.json()["code"] == "tenant_queued_limit"
    assert run.status_code == 429


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"tool": "echo"}, 422, "not_a_sandbox_tool"),
        ({"tool": "nope"}, 422, "unknown_tool"),
        ({"tool": "sandbox", "ttl_seconds": 7200}, 422, "above_maximum"),
        ({"tool": "sandbox", "env": {"RUNYARD_X": "1"}}, 422, "invalid_input"),
        ({"tool": "sandbox", "image": "alpine"}, 422, "validation_error"),
    ],
)
def test_create__refuses_what_cannot_be_a_sandbox(
    client: TestClient, engine: Engine, body: dict[str, Any], status: int, code: str
):
    answer = client.post("/v1/sandboxes", json=body, headers=bearer(engine, "acme"))

    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"command": ["ls"], "cwd": "../.."}, "invalid_cwd"),
        ({"command": ["ls"], "cwd": "/etc"}, "invalid_cwd"),
        ({"command": ["ls"], "env": {"RUNYARD_RUN_ID": "x"}}, "invalid_env"),
        ({"command": ["ls"], "stdin_base64": "not base64!"}, "invalid_stdin"),
        ({"command": []}, "validation_error"),
        ({"command": ["a\x00"]}, "nul_character"),
    ],
)
def test_exec__refuses_bad_commands_with_a_clear_problem(
    client: TestClient, engine: Engine, body: dict[str, Any], code: str
):
    acme = bearer(engine, "acme")
    sid = create(client, acme)["id"]

    answer = client.post(f"/v1/sandboxes/{sid}/exec", json=body, headers=acme)

    assert (answer.status_code, answer.json()["code"]) == (422, code), answer.text


def test_unknown_sandbox_and_exec__are_404(client: TestClient, engine: Engine):
    acme = bearer(engine, "acme")
    sid = create(client, acme)["id"]

    assert client.get(f"/v1/sandboxes/{uuid.uuid4()}", headers=acme).status_code == 404
    missing = client.get(f"/v1/sandboxes/{sid}/execs/{uuid.uuid4()}", headers=acme)
    assert missing.status_code == 404 and missing.json()["code"] == "exec_not_found"


def test_sync_mode__refuses_sandboxes(database_url: str, engine: Engine, registry: ToolRegistry):
    app = make_app(database_url, engine, registry, FakeRunner(), queue_enabled=False)
    with TestClient(app) as client:
        answer = client.post(
            "/v1/sandboxes", json={"tool": "sandbox"}, headers=bearer(engine, "acme")
        )

    assert answer.status_code == 409
    assert answer.json()["code"] == "queue_mode_only"
    assert "queue mode" in answer.json()["detail"]


def test_exec__a_sandbox_takes_at_most_its_total_of_commands(client: TestClient, engine: Engine):
    acme = bearer(engine, "acme")
    sid = create(client, acme)["id"]
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sandboxes SET exec_count = :n WHERE run_id = :id"),
            {"n": MAX_EXECS_TOTAL - 1, "id": sid},
        )

    last = client.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]}, headers=acme)
    over = client.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]}, headers=acme)

    assert last.status_code == 202
    assert over.status_code == 429 and over.json()["code"] == "too_many_execs"


def test_dashboard__lists_the_tenants_sandboxes_and_shows_one_with_its_commands(
    client: TestClient, engine: Engine
):
    acme, other = bearer(engine, "acme"), bearer(engine, "other")
    sid = create(client, acme)["id"]
    theirs = create(client, other)["id"]
    client.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["ls", "-l"]}, headers=acme)
    login = client.post(
        "/ui/login",
        data={"api_key": acme["Authorization"].removeprefix("Bearer "), "next": "/ui/runs"},
        follow_redirects=False,
    )
    assert login.status_code == 303, login.text

    listing = client.get("/ui/sandboxes")
    one = client.get(f"/ui/sandboxes/{sid}")
    hidden = client.get(f"/ui/sandboxes/{theirs}")

    assert listing.status_code == 200 and sid in listing.text and theirs not in listing.text
    assert one.status_code == 200 and "ls -l" in one.text and "pending" in one.text
    assert hidden.status_code == 404


def test_exec_read__a_command_that_finishes_mid_read__answers_every_byte_or_running(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
):
    acme = bearer(engine, "acme")
    sid = create(client, acme)["id"]
    exec_id = client.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]}, headers=acme
    ).json()["id"]
    store = SandboxStore(engine)
    command = uuid.UUID(exec_id)
    assert store.mark_running(command) is not None
    assert store.append(command, "stdout", 0, 6, b"first\n")
    read = SandboxStore.chunks_from
    owner_steps = iter([True])

    def owner_stores_the_last_chunk_and_ends(self: SandboxStore, *args: Any) -> Any:
        # The owner stores its last bytes and ends the command after a read of the output
        # and before the reader looks at the command's row again.
        chunks = read(self, *args)
        if next(owner_steps, False):
            assert store.append(command, "stdout", 6, 5, b"last\n")
            assert store.finish(command, 0, truncated=False, error=None)
        return chunks

    monkeypatch.setattr(SandboxStore, "chunks_from", owner_stores_the_last_chunk_and_ends)

    found = client.get(f"/v1/sandboxes/{sid}/execs/{exec_id}", headers=acme).json()

    assert (found["status"], found["exit_code"]) == ("finished", 0)
    assert found["stdout"] == "first\nlast\n"


def test_create__a_retry_with_its_idempotency_key_answers_the_first_sandbox(
    client: TestClient, engine: Engine
):
    acme = {**bearer(engine, "acme"), "Idempotency-Key": "box-1"}
    body = {"tool": "sandbox", "ttl_seconds": 120}

    first = client.post("/v1/sandboxes", json=body, headers=acme)
    again = client.post("/v1/sandboxes", json=body, headers=acme)
    other = client.post("/v1/sandboxes", json={**body, "ttl_seconds": 60}, headers=acme)

    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert (other.status_code, other.json()["code"]) == (409, "idempotency_conflict")
    with engine.connect() as conn:
        made = conn.execute(text("SELECT count(*) FROM sandboxes")).scalar_one()
        runs = conn.execute(text("SELECT count(*) FROM tool_runs")).scalar_one()
    assert (made, runs) == (1, 1)
    # Another tenant's key of the same name is its own.
    theirs = {**bearer(engine, "other"), "Idempotency-Key": "box-1"}
    assert (
        client.post("/v1/sandboxes", json=body, headers=theirs).json()["id"] != (first.json()["id"])
    )
