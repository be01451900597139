"""The tools file edited under a running API and worker: taken without a restart, a broken
edit refused, a run already admitted kept on the definition it was admitted with."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import bearer, make_settings, run_status, wait_until
from worker.service import Worker, WorkerConfig

ECHO = '[tools.echo]\nimage = "runyard/toolbox:latest"\ncommand = ["echo", "old"]\n'
ADDED = '[tools.added]\nimage = "runyard/toolbox:latest"\ncommand = ["echo", "added"]\n'
RELOAD_SECONDS = 0.2


class RecordingRunner(FakeRunner):
    """A fake engine that remembers the command of every attempt it ran."""

    def __init__(self) -> None:
        super().__init__(handler=self._record)
        self.commands: dict[str, list[str]] = {}

    def _record(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        self.commands[str(spec.run_id)] = list(spec.tool["command"])
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"ran": 1})


@pytest.fixture
def tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "tools.toml"
    path.write_text(ECHO)
    return path


@pytest.fixture
def client(database_url: str, engine: Engine, tools_file: Path) -> Iterator[TestClient]:
    """The API reading ``tools_file`` itself (no registry handed in), re-reading it often."""
    settings = make_settings(
        database_url, tools_file=tools_file, tools_reload_seconds=RELOAD_SECONDS
    )
    with TestClient(create_app(settings, engine=engine)) as test_client:
        yield test_client


def submit(client: TestClient, headers: dict[str, str], tool: str) -> Any:
    return client.post("/v1/runs", json={"tool": tool, "input": {}}, headers=headers)


def run_one(queue: JobQueue, runner: RecordingRunner) -> None:
    worker = Worker(queue, runner, WorkerConfig(worker_id="w-reload", concurrency=2))
    assert worker.run_once().claimed >= 1
    assert worker.wait_idle(timeout=10)
    worker.close()


def test_reload__an_entry_added_to_the_file_is_accepted_and_run_without_a_restart(
    client: TestClient, engine: Engine, queue: JobQueue, tools_file: Path
):
    acme = bearer(engine, "acme")
    refused = submit(client, acme, "added")
    assert refused.status_code == 422 and refused.json()["code"] == "unknown_tool"
    detail = refused.json()["detail"]
    assert str(tools_file) in detail and "RUNYARD_TOOLS_FILE" in detail
    assert f"picked up within {RELOAD_SECONDS:g} s" in detail

    tools_file.write_text(ECHO + ADDED)
    accepted = wait_until(lambda: (r := submit(client, acme, "added")).status_code == 202 and r)
    assert "added" in [t["name"] for t in client.get("/v1/tools", headers=acme).json()]
    runner = RecordingRunner()
    run_one(queue, runner)
    run_id = accepted.json()["id"]
    assert run_status(engine, run_id) == "succeeded"
    assert runner.commands[run_id] == ["echo", "added"]


def test_reload__a_broken_file_keeps_the_registry_loaded_before(
    client: TestClient, engine: Engine, tools_file: Path, caplog: pytest.LogCaptureFixture
):
    acme = bearer(engine, "acme")
    with caplog.at_level(logging.ERROR, logger="runyard.registry.reload"):
        tools_file.write_text(ECHO + ADDED + "[tools.broken]\ncommand = []\n")
        wait_until(lambda: any("is refused" in r.getMessage() for r in caplog.records))
    assert submit(client, acme, "echo").status_code == 202
    assert submit(client, acme, "added").json()["code"] == "unknown_tool"
    refused = next(r for r in caplog.records if "is refused" in r.getMessage())
    assert "tools.broken" in refused.getMessage() and str(tools_file) in refused.getMessage()


def test_reload__an_admitted_run_keeps_the_entry_it_was_admitted_with(
    client: TestClient, engine: Engine, queue: JobQueue, tools_file: Path
):
    acme = bearer(engine, "acme")
    admitted = submit(client, acme, "echo")
    assert admitted.status_code == 202
    tools_file.write_text(ECHO.replace('"old"', '"new"') + 'description = "new"\n')

    def new_definition() -> bool:
        tools = client.get("/v1/tools", headers=acme).json()
        return any(t["name"] == "echo" and t["description"] == "new" for t in tools)

    wait_until(new_definition)
    later = submit(client, acme, "echo")
    runner = RecordingRunner()
    while len(runner.commands) < 2:
        run_one(queue, runner)
    assert runner.commands[admitted.json()["id"]] == ["echo", "old"]
    assert runner.commands[later.json()["id"]] == ["echo", "new"]
