"""Fixtures of the sandbox tests: the API on loopback and a worker that serves sandboxes on
the real Docker engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import docker
import httpx
import pytest
from sqlalchemy import Engine

from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.sandbox_engine import DockerSandboxEngine
from runyard.sandboxes.body import SandboxRunner
from runyard.sandboxes.store import SandboxStore
from runyard.sandboxes.wakeups import ExecWakeups
from tests.integration.api.test_api_helpers import bearer, live_server, make_app
from worker.service import Worker, WorkerConfig


@dataclass
class Stack:
    """The API's client (tenant ``acme``), the worker, and the database."""

    client: httpx.Client
    worker: Worker
    engine: Engine
    url: str

    def create(self, **body: Any) -> dict[str, Any]:
        """A sandbox of the ``sandbox`` tool, waited for until it runs."""
        answer = self.client.post("/v1/sandboxes", json={"tool": "sandbox", **body})
        assert answer.status_code == 201, answer.text
        sandbox: dict[str, Any] = answer.json()
        return self.wait_status(sandbox["id"], "running")

    def wait_status(self, sandbox_id: str, status: str, timeout: float = 30.0) -> dict[str, Any]:
        """The sandbox once it has ``status``."""
        deadline = time.monotonic() + timeout
        while True:
            found: dict[str, Any] = self.client.get(f"/v1/sandboxes/{sandbox_id}").json()
            if found["status"] == status:
                return found
            assert time.monotonic() < deadline, found
            time.sleep(0.1)

    def run(self, sandbox_id: str, command: list[str], **more: Any) -> dict[str, Any]:
        """Exec a command and wait for it to finish."""
        answer = self.client.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"command": command, **more}
        )
        assert answer.status_code == 202, answer.text
        exec_id = answer.json()["id"]
        deadline = time.monotonic() + 60
        while True:
            found: dict[str, Any] = self.client.get(
                f"/v1/sandboxes/{sandbox_id}/execs/{exec_id}", params={"wait": 5}
            ).json()
            if found["status"] == "finished":
                return found
            assert time.monotonic() < deadline, found


def sandbox_worker(
    engine: Engine, client: docker.DockerClient, worker_id: str, wakeups: ExecWakeups
) -> Worker:
    """A worker whose runner serves sandboxes (woken by ``wakeups``), short leases."""
    runner = SandboxRunner(
        DockerRunner(client), DockerSandboxEngine(client), SandboxStore(engine), wakeups=wakeups
    )
    config = WorkerConfig(
        worker_id=worker_id,
        concurrency=4,
        lease_seconds=10.0,
        heartbeat_seconds=1.0,
        poll_seconds=0.2,
    )
    return Worker(JobQueue(engine), runner, config)


@pytest.fixture
def stack(
    database_url: str, engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
) -> Iterator[Stack]:
    """The API and one sandbox worker, stopped (its sandboxes handed over) after the test."""
    app = make_app(database_url, engine, registry, max_wait_seconds=5.0)
    wakeups = ExecWakeups(database_url)
    worker = sandbox_worker(engine, docker_client, "sandbox-worker", wakeups)
    loop = threading.Thread(target=worker.run_forever, name="test-worker", daemon=True)
    loop.start()
    try:
        with (
            live_server(app) as url,
            httpx.Client(base_url=url, headers=bearer(engine, "acme"), timeout=30) as client,
        ):
            yield Stack(client, worker, engine, url)
    finally:
        worker.stop()
        loop.join(timeout=30)
        worker.hand_over()
        worker.close()
        wakeups.stop()
