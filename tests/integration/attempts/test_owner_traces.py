"""Each attempt of a traced run is a span of the run's trace: a retry is a new one, with the
same parent as the attempt before it."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine

from runyard.attempts.flight import LeaseClock
from runyard.attempts.owner import AttemptOwner
from runyard.attempts.policy import OwnerPolicy
from runyard.platform.otel import OtelTracing
from runyard.platform.tracing import NO_TRACING, TraceContext, install
from runyard.queue import JobQueue, NewRun
from runyard.reads.metrics import Metrics
from runyard.runners.fake import FakeRunner
from runyard.traces.context import with_trace

SUBMIT = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def test_retry__a_new_attempt_span_in_the_same_trace(engine: Engine):
    queue = JobQueue(engine, backoff_base_seconds=0.0, backoff_max_seconds=0.0)
    spec = with_trace({"name": "echo"}, SUBMIT)
    run_id = queue.enqueue(
        NewRun(tenant="acme", tool="echo", spec=spec, input={}, max_attempts=2)
    ).run_id
    # The first owner asked for its container and died; the engine has none: a lost attempt.
    [first] = queue.claim(worker_id="dead", engine_id="fake-engine", limit=1, lease_seconds=30)
    assert queue.mark_container_requested(first.job_id, first.lease_token)
    assert queue.release(first.job_id, first.lease_token)
    exporter = InMemorySpanExporter()
    tracing = OtelTracing("runyard-test", exporter)
    install(tracing)
    try:
        metrics = Metrics()
        owner = AttemptOwner(
            queue,
            FakeRunner(),
            OwnerPolicy.worker(lease_seconds=30, margin_seconds=5),
            owner_id="w",
            clock=LeaseClock(metrics),
            metrics=metrics,
            engine_trouble=lambda why: 0.0,
        )
        for _ in range(2):  # the adopted attempt 1 (put back), then attempt 2
            [job] = queue.claim(worker_id="w", engine_id="fake-engine", limit=1, lease_seconds=30)
            assert job.run_id == run_id
            owner.run(owner.hold(job))
    finally:
        install(NO_TRACING)
        tracing.shutdown()
    attempts = [s for s in exporter.get_finished_spans() if s.name == "attempt"]
    assert [s.attributes["runyard.attempt"] for s in attempts] == [1, 2]  # type: ignore[index]
    for span in attempts:
        assert span.context.trace_id == int(SUBMIT.trace_id, 16)
        assert span.parent is not None and span.parent.span_id == int(SUBMIT.span_id, 16)
    assert attempts[0].context.span_id != attempts[1].context.span_id
