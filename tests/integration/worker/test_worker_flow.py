"""Flow limits with real workers: four workers whose chore threads pass the flow gate never
run more of a concurrency key than its maximum, sampled throughout, and run every run."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.maintenance.chores import Chore, Chores
from runyard.queue import AdmissionCaps, ApiQueue, JobQueue
from runyard.queue.flow import FlowGate
from runyard.registry.tools import FlowSpec, ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from runyard.submission.request import RunRequest
from worker.service import Worker, WorkerConfig

RUNNING_OF_KEY = text(
    "SELECT count(*) FROM tool_runs WHERE concurrency_key = 'hot' AND status = 'running'"
)
LEFT = text("SELECT count(*) FROM tool_runs WHERE status <> 'succeeded'")


@pytest.mark.slow
def test_four_workers__a_key_limited_to_two_never_has_more_running(
    engine: Engine, registry: ToolRegistry
):
    echo = registry.tools["echo"].model_copy(update={"flow": FlowSpec(key_max_running=2)})
    flows = dataclasses.replace(registry, tools={**registry.tools, "echo": echo})
    submits = ApiQueue(engine)
    for key in ["hot"] * 12 + ["cold"] * 4:
        run = RunRequest("acme", "echo", {}, concurrency_key=key).prepare(flows)
        submits.submit(run, AdmissionCaps())

    def attempt(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        time.sleep(0.05)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    workers = []
    for n in range(4):
        gate = FlowGate(engine, flows.flow_config)
        worker = Worker(
            JobQueue(engine),
            FakeRunner(attempt),
            WorkerConfig(worker_id=f"w{n}", concurrency=2, poll_seconds=0.05),
            chores=Chores([Chore("flow gate", 0.05, gate.release)]),
        )
        workers.append(worker)
    threads = [threading.Thread(target=worker.run_forever) for worker in workers]
    samples: list[int] = []
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        left = -1
        while time.monotonic() < deadline and left != 0:
            with engine.connect() as conn:
                samples.append(conn.execute(RUNNING_OF_KEY).scalar_one())
                left = conn.execute(LEFT).scalar_one()
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(timeout=30)
        for worker in workers:
            worker.close()
    assert left == 0
    assert len(samples) > 20 and max(samples) == 2
