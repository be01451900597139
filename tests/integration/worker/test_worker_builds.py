"""The worker's build loop with a fake builder and runner, real Postgres: runs wait for
their engine's build, many runs on two workers make one build."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, text

from runyard.builders.fake import FakeBuilder
from runyard.queue import BUILDS_CHANNEL, JobQueue
from runyard.queue.builds import BuildQueue
from runyard.runners.fake import FakeRunner
from runyard.submission.request import prepare_run
from runyard.usage.ledger import UsageLedger
from tests.integration.builds.support import built_tools
from tests.otlp_receiver import traced_to_receiver
from worker.builds import BuildAgent, BuildConfig
from worker.service import Worker, WorkerConfig
from worker.wakeup import Wakeups


def worker(queue: JobQueue, engine: Engine, builder: FakeBuilder, worker_id: str) -> Worker:
    agent = BuildAgent(
        BuildQueue(engine),
        builder,
        BuildConfig(worker_id=worker_id, heartbeat_seconds=0.5),
        UsageLedger(engine),
    )
    config = WorkerConfig(worker_id=worker_id, concurrency=5)
    return Worker(queue, FakeRunner(engine_id="engine-a"), config, builds=agent)


def statuses(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [str(s) for s in conn.execute(text("SELECT status FROM tool_runs")).scalars()]


def until(condition: Callable[[], bool], workers: list[Worker], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        for w in workers:
            w.run_once()
        time.sleep(0.05)


def test_ten_runs_on_two_workers_of_one_engine__one_build_then_all_succeed(
    tmp_path: Path, engine: Engine, queue: JobQueue
):
    tools = built_tools(tmp_path, engine)
    run_ids: list[uuid.UUID] = []
    for i in range(10):
        run_ids.append(
            queue.enqueue(
                prepare_run(tools, tenant="acme", tool_name="stats", input_value={"i": i})
            ).run_id
        )
    builder = FakeBuilder(seconds=0.5, cpu_seconds=0.25)
    workers = [worker(queue, engine, builder, "w1"), worker(queue, engine, builder, "w2")]
    until(lambda: statuses(engine) == ["succeeded"] * 10, workers)
    for w in workers:
        assert w.wait_idle(10)
        w.close()
    assert len(builder.built) == 1
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status, attempts FROM tool_builds")).all()
    assert [tuple(r)[1:] for r in rows] == [("ready", 1)]
    # Metered once, charged to the tenant whose runs waited; its parent cgroup then dropped.
    [(tenant, cpu, wall)] = build_usage(engine)
    assert (tenant, cpu) == ("acme", 0.25) and wall >= 0.5
    assert builder.forgotten == [f"build-{rows[0].id}"]


def build_usage(engine: Engine) -> list[tuple[str | None, float | None, float]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tenant, cpu_seconds, wall_seconds FROM build_usage"))
        return [(row.tenant, row.cpu_seconds, row.wall_seconds) for row in rows]


def test_failed_build__fails_the_waiting_runs_with_the_log_tail(
    tmp_path: Path, engine: Engine, queue: JobQueue
):
    tools = built_tools(tmp_path, engine)
    run = prepare_run(tools, tenant="acme", tool_name="stats", input_value={})
    run_id = queue.enqueue(run).run_id
    builder = FakeBuilder(fail=frozenset({run.spec["build"]["tag"]}))
    workers = [worker(queue, engine, builder, "w1")]
    until(lambda: statuses(engine) == ["failed"], workers)
    workers[0].close()
    with engine.connect() as conn:
        code, error = conn.execute(
            text("SELECT error_code, error FROM tool_runs WHERE id = :id"), {"id": run_id}
        ).one()
    assert code == "build_failed"
    assert "fake failure" in error and "ERROR: the fake build failed" in error
    # A failed build consumed too: metered before it failed (nothing measured by this fake).
    assert [usage[:2] for usage in build_usage(engine)] == [("acme", None)]


def test_traced__a_run_that_waited_for_its_build_has_a_wait_span_linked_to_the_build(
    tmp_path: Path, engine: Engine, queue: JobQueue
):
    tools = built_tools(tmp_path, engine)
    run_id = queue.enqueue(prepare_run(tools, tenant="acme", tool_name="stats", input_value={}))
    with traced_to_receiver() as (receiver, tracing):
        workers = [worker(queue, engine, FakeBuilder(seconds=0.2), "w1")]
        until(lambda: statuses(engine) == ["succeeded"], workers)
        assert workers[0].wait_idle(10)
        workers[0].close()
        tracing.shutdown()
    [build] = receiver.named("build")
    [attempt] = receiver.named("attempt")
    [wait] = receiver.named("build.wait")
    assert attempt.attributes["runyard.run_id"] == str(run_id.run_id)
    assert (wait.trace_id, wait.parent_span_id) == (attempt.trace_id, attempt.span_id)
    assert wait.links == ((build.trace_id, build.span_id),)
    assert build.attributes["runyard.build.tag"] == wait.attributes["runyard.build.tag"]


class CountingBuildQueue(BuildQueue):
    """A build queue that counts the build rounds (their probe) and the rounds' statements."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.rounds = 0
        self.requests = 0

    def pending(self, engine_id: str, *, now: datetime | None = None) -> bool:
        self.rounds += 1
        return super().pending(engine_id, now=now)

    def request_builds(
        self, engine_id: str, queues: Sequence[str], *, now: datetime | None = None
    ) -> list[str]:
        self.requests += 1
        return super().request_builds(engine_id, queues, now=now)


def test_build_agent__rounds_closer_than_min_round_seconds_are_skipped(engine: Engine):
    builds = CountingBuildQueue(engine)
    config = BuildConfig(worker_id="w1", min_round_seconds=0.3)
    agent = BuildAgent(builds, FakeBuilder(seconds=0.1), config)
    for _ in range(5):
        agent.run_once("engine-a")
    assert builds.rounds == 1
    time.sleep(0.35)
    agent.run_once("engine-a")
    assert builds.rounds == 2


def test_build_agent__a_round_with_nothing_to_build_is_one_probe(
    tmp_path: Path, engine: Engine, queue: JobQueue
):
    builds = CountingBuildQueue(engine)
    agent = BuildAgent(builds, FakeBuilder(seconds=0.1), BuildConfig(worker_id="w1"))
    assert not agent.run_once("engine-a")
    assert (builds.rounds, builds.requests) == (1, 0)
    # A run that waits for its build: the next round requests it and starts building.
    tools = built_tools(tmp_path, engine)
    queue.enqueue(prepare_run(tools, tenant="acme", tool_name="stats", input_value={}))
    assert agent.run_once("engine-a")
    assert (builds.rounds, builds.requests) == (2, 1)
    assert agent.wait(timeout=10)


def test_build_agent__rests_after_a_round_with_nothing_only_while_it_hears_build_jobs(
    tmp_path: Path, engine: Engine, queue: JobQueue, database_url: str
):
    builds = CountingBuildQueue(engine)
    config = BuildConfig(worker_id="w1", heard_rest_seconds=600.0)
    agent = BuildAgent(builds, FakeBuilder(seconds=0.1), config)
    # Not hearing: every round probes.
    agent.run_once("engine-a")
    agent.run_once("engine-a")
    assert builds.rounds == 2
    woken = threading.Event()

    def on_build() -> None:
        agent.wake()
        woken.set()

    wakeups = Wakeups(
        database_url,
        lambda: None,
        lambda job_id: None,
        on_build=on_build,
        on_listening=lambda channels: agent.hears_builds(BUILDS_CHANNEL in channels),
    )
    wakeups.start()
    try:
        assert wakeups.connected.wait(10)
        agent.run_once("engine-a")  # the first round with the link up looks
        assert builds.rounds == 3
        for _ in range(3):
            assert not agent.run_once("engine-a")  # nothing found: it rests
        # A run of a tool built from source: its notification ends the rest.
        tools = built_tools(tmp_path, engine)
        queue.enqueue(prepare_run(tools, tenant="acme", tool_name="stats", input_value={}))
        assert woken.wait(10)
        assert agent.run_once("engine-a")
        assert (builds.rounds, builds.requests) == (4, 1)
        assert agent.wait(timeout=10)
    finally:
        wakeups.stop()
    # The link lost: the next round looks, and none rests after it.
    agent.hears_builds(False)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM tool_run_jobs"))
    before = builds.rounds
    for _ in range(3):
        agent.run_once("engine-a")
    assert builds.rounds == before + 3


def test_worker__tells_its_build_round_what_the_listener_hears_and_wakes_it(
    engine: Engine, queue: JobQueue
):
    builds = CountingBuildQueue(engine)
    agent = BuildAgent(
        builds, FakeBuilder(seconds=0.1), BuildConfig(worker_id="w1", heard_rest_seconds=600.0)
    )
    w = Worker(queue, FakeRunner(engine_id="engine-a"), WorkerConfig(worker_id="w1"), builds=agent)
    w.notify_listening(frozenset({"runyard_jobs", "runyard_held"}))  # no build channel
    w.run_once()
    w.run_once()
    assert builds.rounds == 2  # not hearing build jobs: no rest
    w.notify_listening(frozenset({"runyard_jobs", BUILDS_CHANNEL}))
    for _ in range(3):
        w.run_once()
    assert builds.rounds == 3  # one look, then the rest
    w.notify_build()
    w.run_once()
    w.run_once()
    assert builds.rounds == 4  # woken once
    w.notify_listening(frozenset())  # the link lost
    w.run_once()
    w.run_once()
    assert builds.rounds == 6
    w.stop()
