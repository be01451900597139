"""Live log chunks in the event log, resumed by an adopter without loss or repetition."""

from __future__ import annotations

import time

import docker
import pytest
from sqlalchemy import Engine, text

from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.docker.outputs import ContainerLogs
from runyard.runners.docker.runner import DockerRunner
from runyard.submission.request import prepare_run
from tests.integration.docker.test_docker_runner import shell
from worker.service import Worker, WorkerConfig

pytestmark = pytest.mark.docker

SCRIPT = "for i in 1 2 3 4 5 6 7 8; do echo out$i; echo err$i >&2; sleep 0.25; done"


def stream_events(engine: Engine, run_id: object, stream: str) -> list[dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT data FROM tool_run_events WHERE run_id = :id AND type = :t ORDER BY id"),
            {"id": run_id, "t": stream},
        ).scalars()
        return list(rows)


@pytest.mark.slow  # a container that writes for seconds
def test_live_logs__stream_while_running(
    queue: JobQueue, engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
):
    run = prepare_run(registry, tenant="t", tool_name="shell", input_value={"script": SCRIPT})
    run_id = queue.enqueue(run).run_id
    worker = Worker(queue, DockerRunner(docker_client), WorkerConfig(worker_id="w1"))
    worker.run_once()
    deadline = time.monotonic() + 20
    while not stream_events(engine, run_id, "stdout") and time.monotonic() < deadline:
        time.sleep(0.1)
    with engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM tool_runs WHERE id = :id"), {"id": run_id}
        ).scalar_one()
    assert status == "running"  # the first chunk arrived before the end
    assert worker.wait_idle(timeout=30)
    worker.close()
    out = "".join(str(e["text"]) for e in stream_events(engine, run_id, "stdout"))
    err = "".join(str(e["text"]) for e in stream_events(engine, run_id, "stderr"))
    assert out == "".join(f"out{i}\n" for i in range(1, 9))
    assert err == "".join(f"err{i}\n" for i in range(1, 9))


@pytest.mark.slow  # a container that writes for seconds, adopted midway
def test_live_logs__adopter_resumes_without_loss_or_repeat(
    queue: JobQueue, engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
):
    run = prepare_run(registry, tenant="t", tool_name="shell", input_value={"script": SCRIPT})
    run_id = queue.enqueue(run).run_id
    runner = DockerRunner(docker_client)
    first = Worker(queue, runner, WorkerConfig(worker_id="w1"))
    first.run_once()
    deadline = time.monotonic() + 20
    while len(stream_events(engine, run_id, "stdout")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.hand_over() == 1  # leases released, container left running

    second = Worker(queue, DockerRunner(docker_client), WorkerConfig(worker_id="w2"))
    assert second.run_once().adopted == 1
    assert second.wait_idle(timeout=30)
    second.close()
    out = "".join(str(e["text"]) for e in stream_events(engine, run_id, "stdout"))
    assert out == "".join(f"out{i}\n" for i in range(1, 9))
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, attempts, stdout FROM tool_runs WHERE id = :id"), {"id": run_id}
        ).one()
    assert row.status == "succeeded" and row.attempts == 1
    assert row.stdout == "".join(f"out{i}\n" for i in range(1, 9))


@pytest.mark.slow  # sits out a silence
def test_live_logs__a_line_before_a_long_silence_arrives_during_the_silence(
    queue: JobQueue, engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
):
    # Regression: the chunk was flushed only when a later chunk arrived, so a tool that
    # printed "starting" and then worked quietly showed nothing until it ended.
    script = "echo starting; echo warming >&2; sleep 30; echo never-waited-for"
    run = prepare_run(registry, tenant="t", tool_name="shell", input_value={"script": script})
    run_id = queue.enqueue(run).run_id
    # The cancel at the end reaches the worker with its next heartbeat: one a second.
    config = WorkerConfig(worker_id="w1", heartbeat_seconds=1)
    worker = Worker(queue, DockerRunner(docker_client), config)
    worker.run_once()
    deadline = time.monotonic() + 20
    while not (stream_events(engine, run_id, "stdout") and stream_events(engine, run_id, "stderr")):
        assert time.monotonic() < deadline, "the first lines did not arrive during the sleep"
        time.sleep(0.1)
    assert [e["text"] for e in stream_events(engine, run_id, "stdout")] == ["starting\n"]
    assert [e["text"] for e in stream_events(engine, run_id, "stderr")] == ["warming\n"]
    assert queue.cancel(run_id).status is not None
    assert worker.wait_idle(timeout=30)
    worker.close()


class RecordingSink:
    """A log sink in memory: the chunks written, and the last position per stream."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, str, str]] = []

    def resume_point(self, stream: str) -> str | None:
        stamps = [until for s, _, until in self.chunks if s == stream]
        return stamps[-1] if stamps else None

    def write(self, stream: str, text: str, until: str) -> bool:
        self.chunks.append((stream, text, until))
        return True


def test_live_logs__quick_run_is_sent_once_from_the_stored_log_and_never_repeated(
    registry: ToolRegistry, docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
):
    follows: list[str] = []
    original = ContainerLogs.logs

    def counting(self: ContainerLogs, **kwargs: object) -> object:
        follows.append(str(kwargs.get("stdout")))
        return original(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ContainerLogs, "logs", counting)
    spec = shell(registry, "echo one; echo two >&2; echo three")
    sink = RecordingSink()
    runner = DockerRunner(docker_client)
    result = runner.run(spec, AttemptControl(logs=sink))
    assert result.stdout == "one\nthree\n" and result.stderr == "two\n"
    assert follows == []  # finished before a follower was worth starting
    assert [(s, t) for s, t, _ in sink.chunks] == [("stdout", "one\nthree\n"), ("stderr", "two\n")]

    # An adopter of the exited container (say we died before the finalize) follows from the
    # sink's position: nothing is sent twice.
    again = runner.run(spec, AttemptControl(logs=sink))
    assert again.stdout == "one\nthree\n"
    assert len(follows) == 2 and len(sink.chunks) == 2

    # One that arrives before anything was sent gets everything, once.
    fresh = RecordingSink()
    runner.run(spec, AttemptControl(logs=fresh))
    for stream, text_ in (("stdout", "one\nthree\n"), ("stderr", "two\n")):
        assert "".join(t for s, t, _ in fresh.chunks if s == stream) == text_


def test_live_logs__a_failing_sink_never_fails_the_attempt(
    registry: ToolRegistry, docker_client: docker.DockerClient
):
    class FailingSink(RecordingSink):
        def write(self, stream: str, text: str, until: str) -> bool:
            raise RuntimeError("sink down")

    spec = shell(registry, "echo kept")
    result = DockerRunner(docker_client).run(spec, AttemptControl(logs=FailingSink()))
    assert result.exit_code == 0 and result.stdout == "kept\n"  # the stored log is the record


def test_live_logs__quick_run_through_the_worker_lands_in_the_events(
    queue: JobQueue, engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
):
    run = prepare_run(
        registry, tenant="t", tool_name="shell", input_value={"script": "echo a; echo b >&2"}
    )
    run_id = queue.enqueue(run).run_id
    worker = Worker(queue, DockerRunner(docker_client), WorkerConfig(worker_id="w1"))
    worker.run_once()
    assert worker.wait_idle(timeout=30)
    worker.close()
    # What `runyard logs --follow` prints: every line once, before the final status event.
    assert "".join(str(e["text"]) for e in stream_events(engine, run_id, "stdout")) == "a\n"
    assert "".join(str(e["text"]) for e in stream_events(engine, run_id, "stderr")) == "b\n"
    with engine.connect() as conn:
        types = conn.execute(
            text("SELECT type FROM tool_run_events WHERE run_id = :id ORDER BY id"), {"id": run_id}
        ).scalars()
        order = [t for t in types if t in ("stdout", "stderr", "status")]
    assert order[-1] == "status" and {"stdout", "stderr"} <= set(order[:-1])
