"""Builds through the API and the CLI: a built tool's status per engine, an admin's build
request, the build listed and read with its log, its events streamed, submits of a failed
digest failing fast."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.queue.builds import BuildQueue
from runyard.registry.tools import load_registry
from runyard.tenancy.auth import create_api_key
from tests.integration.api.cli_support import Api
from tests.integration.api.test_api_helpers import bearer, live_server, make_app

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "tools" / "examples", tmp_path / "examples")
    shutil.copy(ROOT / "tools" / "tools.toml", tmp_path / "tools.toml")
    return tmp_path


@pytest.fixture
def client(database_url: str, engine: Engine, tools_dir: Path) -> Iterator[TestClient]:
    registry = load_registry(tools_dir / "tools.toml", Settings(database_url="unused"))
    app = make_app(database_url, engine, registry)
    with TestClient(app) as test_client:
        yield test_client


def live_worker(engine: Engine, engine_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO workers (id, engine_id, host, pid, queues) "
                "VALUES (:id, :e, 'h', 1, '{default}')"
            ),
            {"id": f"w-{engine_id}", "e": engine_id},
        )


def numstats(client: TestClient, headers: dict[str, str]) -> dict[str, object]:
    [tool] = [t for t in client.get("/v1/tools", headers=headers).json() if t["name"] == "numstats"]
    return dict(tool)


def test_build_request__admin_only_then_listed_streamed_and_shown_per_engine(
    client: TestClient, engine: Engine
):
    acme, admin = bearer(engine, "acme"), bearer(engine, "ops", admin=True)
    before = numstats(client, acme)
    build = before["build"]
    assert isinstance(build, dict) and build["engines"] == {}
    assert before["image"] == build["tag"] and str(build["tag"]).startswith("runyard-build/")
    assert client.post("/v1/tools/numstats/build", headers=acme).status_code == 403
    assert client.post("/v1/tools/echo/build", headers=admin).status_code == 422
    assert client.post("/v1/tools/nope/build", headers=admin).status_code == 404
    live_worker(engine, "engine-a")
    asked = client.post("/v1/tools/numstats/build", headers=admin)
    assert asked.status_code == 202 and asked.json()["queued"] == 1
    assert numstats(client, acme)["build"]["engines"] == {"engine-a": "queued"}  # type: ignore[index]
    [listed] = client.get("/v1/builds", params={"tool": "numstats"}, headers=acme).json()
    assert (listed["status"] == "queued" and "log" not in listed) or listed["log"] is None
    builds = BuildQueue(engine)
    held = builds.claim(worker_id="w", engine_id="engine-a", lease_seconds=30)
    assert held is not None
    builds.append_log(held.build_id, held.lease_token, "Step 1/3 : FROM runyard/toolbox\n")
    builds.ready(held.build_id, held.lease_token, "sha256:abc")
    one = client.get(f"/v1/builds/{listed['id']}", headers=acme).json()
    assert one["status"] == "ready" and one["log"].startswith("Step 1/3")
    with client.stream("GET", f"/v1/builds/{listed['id']}/events", headers=acme) as stream:
        body = "".join(stream.iter_text())
    assert "event: log" in body and "event: status" in body
    assert '"status": "ready"' in body and "id: 32" in body
    assert client.get(f"/v1/builds/{uuid.uuid4()}", headers=acme).status_code == 404


def test_failed_build__later_submits_fail_fast_until_a_rebuild(client: TestClient, engine: Engine):
    acme, admin = bearer(engine, "acme"), bearer(engine, "ops", admin=True)
    live_worker(engine, "engine-a")
    client.post("/v1/tools/numstats/build", headers=admin)
    builds = BuildQueue(engine)
    held = builds.claim(worker_id="w", engine_id="engine-a", lease_seconds=30)
    assert held is not None
    builds.failed(held.build_id, held.lease_token, "build of x failed: exit 3\nthe step")
    run = client.post(
        "/v1/runs", json={"tool": "numstats", "input": {"numbers": [1]}}, headers=acme
    )
    assert run.status_code == 200  # ended already: the answer is the terminal run
    shown = client.get(f"/v1/runs/{run.json()['id']}", headers=acme).json()
    assert (shown["status"], shown["error_code"]) == ("failed", "build_failed")
    assert shown["error"] == "build of x failed: exit 3\nthe step"
    assert client.post("/v1/tools/numstats/build", headers=admin).json()["queued"] == 1
    again = client.post(
        "/v1/runs", json={"tool": "numstats", "input": {"numbers": [1]}}, headers=acme
    )
    assert client.get(f"/v1/runs/{again.json()['id']}", headers=acme).json()["status"] == "queued"


@pytest.mark.slow  # a CLI command in a process of its own per step
def test_cli__build_and_builds(database_url: str, engine: Engine, tools_dir: Path):
    registry = load_registry(tools_dir / "tools.toml", Settings(database_url="unused"))
    app = make_app(database_url, engine, registry)
    live_worker(engine, "engine-a")
    with live_server(app) as url:
        api = Api(url, create_api_key(engine, "ops", admin=True), engine, JobQueue(engine))
        asked = api.run("build", "numstats", "--json")
        assert asked.returncode == 0, asked.stderr
        assert json.loads(asked.stdout)["queued"] == 1
        listed = api.run("builds", "--json")
        [build] = json.loads(listed.stdout)
        assert build["tool"] == "numstats" and build["status"] == "queued"
        builds = BuildQueue(engine)
        held = builds.claim(worker_id="w", engine_id="engine-a", lease_seconds=30)
        assert held is not None
        builds.ready(held.build_id, held.lease_token, "sha256:abc")
        waited = api.run("build", "numstats", "--wait")
        assert waited.returncode == 0, waited.stderr
        assert "engine-a ready" in waited.stdout
        shown = api.run("builds", build["id"])
        assert "ready" in shown.stdout
    assert datetime.now(UTC)  # the server stopped cleanly


def test_dashboard__builds_page_shows_status_per_engine_and_a_builds_log(
    database_url: str, engine: Engine, tools_dir: Path
):
    registry = load_registry(tools_dir / "tools.toml", Settings(database_url="unused"))
    app = make_app(database_url, engine, registry)
    live_worker(engine, "engine-a")
    with TestClient(app, follow_redirects=False) as client:
        key = create_api_key(engine, "ops", admin=True)
        logged = client.post("/ui/login", data={"api_key": key, "next": "/ui/runs"})
        assert logged.status_code == 303
        empty = client.get("/ui/builds").text
        assert "numstats" in empty and "not built yet" in empty
        client.post("/v1/tools/numstats/build", headers={"Authorization": f"Bearer {key}"})
        builds = BuildQueue(engine)
        held = builds.claim(worker_id="w", engine_id="engine-a", lease_seconds=30)
        assert held is not None
        builds.append_log(held.build_id, held.lease_token, "Step 2/3 : COPY numstats.sh\n")
        listing = client.get("/ui/builds").text
        assert "b-building" in listing and f"/ui/builds/{held.build_id}" in listing
        running = client.get(f"/ui/builds/{held.build_id}").text
        assert 'http-equiv="refresh"' in running and "Step 2/3 : COPY numstats.sh" in running
        builds.failed(held.build_id, held.lease_token, "build of x failed: exit 1")
        ended = client.get(f"/ui/builds/{held.build_id}").text
        assert 'http-equiv="refresh"' not in ended and "build of x failed: exit 1" in ended
        assert client.get(f"/ui/builds/{uuid.uuid4()}").status_code == 404
        assert "Built from" in client.get("/ui/tools").text
