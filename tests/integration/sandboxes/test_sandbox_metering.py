"""A sandbox's attempt is metered like a run's, and each of its commands is a span of that
attempt with its exit code (the container and its commands faked, the queue and the API
real, spans exported to a receiver on loopback)."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.domain.usage import AttemptUsage
from runyard.platform.otel import OtelTracing
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from runyard.sandboxes.body import SandboxRunner
from runyard.sandboxes.fake import FakeSandboxEngine
from runyard.sandboxes.store import SandboxStore
from tests.integration.api.test_api_helpers import bearer, make_app
from tests.otlp_receiver import OtlpReceiver, traced_to_receiver
from worker.service import Worker, WorkerConfig

USED = AttemptUsage(cpu_seconds=1.5, memory_peak_bytes=4096, memory_avg_bytes=2048, wall_seconds=3)


def held_until_deleted(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
    """The sandbox's container: up until the delete, then what it consumed."""
    control.cancel.wait(30)
    return AttemptResult(status=RunStatus.CANCELLED, exit_code=137, usage=USED)


@pytest.fixture
def traced() -> Iterator[tuple[OtlpReceiver, OtelTracing]]:
    with traced_to_receiver() as both:
        yield both


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return found


@pytest.mark.slow  # a sandbox held and ended: seconds of rounds and leases
def test_sandbox__its_attempt_is_metered_and_each_command_is_a_span_of_it(
    traced: tuple[OtlpReceiver, OtelTracing],
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
):
    receiver, tracing = traced
    fake = FakeSandboxEngine()
    runner = SandboxRunner(
        FakeRunner(held_until_deleted), fake, SandboxStore(engine), poll_seconds=0.05
    )
    worker = Worker(JobQueue(engine), runner, WorkerConfig(worker_id="sandboxes", concurrency=1))
    acme = bearer(engine, "acme")
    with TestClient(make_app(database_url, engine, registry)) as client:
        sandbox = client.post("/v1/sandboxes", json={"tool": "sandbox"}, headers=acme).json()
        base = f"/v1/sandboxes/{sandbox['id']}"
        worker.run_once()
        wait_for(lambda: client.get(base, headers=acme).json()["status"] == "running", "running")
        exec_ids = [
            client.post(f"{base}/exec", json={"command": [name]}, headers=acme).json()["id"]
            for name in ("true", "false")
        ]
        wait_for(lambda: len(fake.execs) == 2, "both commands started")
        for exec_id, code in zip(exec_ids, (0, 3), strict=True):
            fake.execs[uuid.UUID(exec_id)].exit_code = code

        def finished(url: str) -> bool:
            return bool(client.get(url, headers=acme).json()["status"] == "finished")

        for exec_id in exec_ids:
            url = f"{base}/execs/{exec_id}"
            wait_for(functools.partial(finished, url), url)
        assert client.delete(base, headers=acme).status_code == 200
        assert worker.wait_idle(timeout=30)
        worker.close()
    tracing.shutdown()

    with engine.connect() as conn:
        metered = conn.execute(
            text("SELECT attempt, cpu_seconds, tenant FROM attempt_usage WHERE run_id = :id"),
            {"id": sandbox["id"]},
        ).all()
    assert [tuple(row) for row in metered] == [(1, 1.5, "acme")]
    [attempt] = receiver.named("attempt")
    commands = {s.attributes["runyard.exec_id"]: s for s in receiver.named("sandbox.exec")}
    assert sorted(commands) == sorted(exec_ids)
    for exec_id, code in zip(exec_ids, (0, 3), strict=True):
        span = commands[exec_id]
        assert (span.trace_id, span.parent_span_id) == (attempt.trace_id, attempt.span_id)
        assert span.attributes["process.exit.code"] == code
