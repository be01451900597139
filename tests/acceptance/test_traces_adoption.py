"""A worker killed with ``kill -9`` while its attempt's container runs: the adopter's attempt
span is in the same trace and links to the dead owner's, which the container's own
TRACEPARENT names."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from runyard.platform.tracing import TraceContext
from runyard.submission.request import prepare_run
from runyard.traces.context import with_trace
from tests.acceptance.cluster import Cluster, Expected
from tests.otlp_receiver import OtlpReceiver, otlp_receiver

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

SUBMIT = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


@pytest.fixture
def receiver(cluster: Cluster) -> Iterator[OtlpReceiver]:
    """Every process the cluster starts from now on exports its spans here, within 0.1 s."""
    with otlp_receiver() as found:
        cluster.env.update(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": found.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        )
        yield found


def test_kill9_adoption__the_adopters_attempt_links_the_dead_owners(
    cluster: Cluster, receiver: OtlpReceiver
):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1)
    # As a traced API submits it: the run's snapshot carries its submit span's context.
    run = prepare_run(
        cluster.registry, tenant="acceptance", tool_name="traceparent", input_value={"seconds": 4}
    )
    run_id = cluster.queue.enqueue(
        dataclasses.replace(run, spec=with_trace(run.spec, SUBMIT))
    ).run_id
    cluster.accepted[run_id] = Expected("succeeded")
    cluster.wait_for(lambda: bool(receiver.named("container.start")), 60, "w1's started span")
    [started] = receiver.named("container.start")
    cluster.kill9("w1")  # its attempt span never ends, so it is never exported
    cluster.start_worker("w2", concurrency=1)
    cluster.check_invariants()
    assert cluster.run_row(run_id).adoptions == 1

    def adopted_attempt() -> bool:
        return any(s.attributes.get("runyard.adopted") for s in receiver.named("attempt"))

    cluster.wait_for(adopted_attempt, 30, "the adopter's attempt span")
    [adopter] = [s for s in receiver.named("attempt") if s.attributes.get("runyard.adopted")]
    dead_owner_span = started.parent_span_id
    assert adopter.trace_id == started.trace_id
    assert adopter.links == ((started.trace_id, dead_owner_span),)
    assert adopter.service == started.service == "runyard-worker"
    assert adopter.attributes["runyard.worker_id"] == "w2"
    # Both attempts are children of the run's submit span; the adopter's steps are its own.
    assert (adopter.trace_id, adopter.parent_span_id) == (SUBMIT.trace_id, SUBMIT.span_id)
    [wait] = [s for s in receiver.named("container.wait") if s.parent_span_id == adopter.span_id]
    assert wait.attributes["runyard.adopted"] is True
    # The container was made by the first owner: its TRACEPARENT names that owner's span.
    result = cluster.run_row(run_id).result
    _, trace_id, parent_id, _ = result["traceparent"].split("-")
    assert (trace_id, parent_id) == (started.trace_id, dead_owner_span)
