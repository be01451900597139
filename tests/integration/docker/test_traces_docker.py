"""One run's spans, exported over OTLP/HTTP to a receiver on loopback: one trace (the
caller's when it sent a traceparent), the steps with their parents, and the tool's own
TRACEPARENT in the same trace, under the attempt's span."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.platform.otel import OtelTracing
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runners.docker.runner import DockerRunner
from tests.integration.api.test_api_helpers import make_app
from tests.otlp_receiver import OtlpReceiver, traced_to_receiver
from worker.service import Worker, WorkerConfig

pytestmark = pytest.mark.docker

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def traced() -> Iterator[tuple[OtlpReceiver, OtelTracing]]:
    """Tracing on for this test, exporting to a receiver on loopback; off again after."""
    with traced_to_receiver() as both:
        yield both


@pytest.fixture
def run_traced(
    traced: tuple[OtlpReceiver, OtelTracing],
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    queue: JobQueue,
    docker_runner: DockerRunner,
) -> Callable[[dict[str, str]], dict[str, Any]]:
    """Submit a run of the traceparent tool with ``headers``, run it, export every span:
    the run as the API shows it at the end."""

    def run(headers: dict[str, str]) -> dict[str, Any]:
        app = make_app(database_url, engine, registry, auth_disabled=True)
        with TestClient(app) as client:
            body = {"tool": "traceparent", "input": {}}
            submitted = client.post("/v1/runs", json=body, headers=headers)
            assert submitted.status_code == 202, submitted.text
            worker = Worker(queue, docker_runner, WorkerConfig(worker_id="traced", concurrency=1))
            worker.run_once()
            assert worker.wait_idle(timeout=60)
            worker.close()
            shown: dict[str, Any] = client.get(f"/v1/runs/{submitted.json()['id']}").json()
        traced[1].shutdown()  # exports what is batched
        assert shown["status"] == "succeeded", shown
        return shown

    return run


def test_traces__one_run_is_one_trace_of_the_callers_with_its_steps(
    traced: tuple[OtlpReceiver, OtelTracing],
    run_traced: Callable[[dict[str, str]], dict[str, Any]],
):
    receiver = traced[0]
    run = run_traced({"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    run_id = run["id"]
    assert run["trace_id"] == CALLER_TRACE  # stored and shown
    spans = receiver.spans(CALLER_TRACE)
    # One trace, the caller's: every span of the run's way (the later GET is a trace of its own).
    of_the_run = [s for s in receiver.spans() if s.name != "GET /v1/runs/{run_id}"]
    assert {s.trace_id for s in of_the_run} == {CALLER_TRACE}
    by_name = {s.name: s for s in spans}
    http, submit, attempt = by_name["POST /v1/runs"], by_name["submit"], by_name["attempt"]
    assert http.parent_span_id == CALLER_SPAN
    assert http.attributes["http.response.status_code"] == 202
    assert submit.parent_span_id == http.span_id
    assert submit.attributes["runyard.run_id"] == run_id
    assert attempt.parent_span_id == submit.span_id
    assert attempt.attributes["runyard.attempt"] == 1 and not attempt.links
    # The span starts at the claim; the finalize is its one event, the outcome an attribute.
    assert attempt.attributes["runyard.status"] == "succeeded"
    assert attempt.events == ("finalize",)
    assert "runyard.adopted" not in attempt.attributes
    for step in (
        "container.create",
        "container.start",
        "container.wait",
        "outputs.collect",
    ):
        assert by_name[step].parent_span_id == attempt.span_id, step

    # The tool's TRACEPARENT: the same trace, under the attempt's span.
    _, trace_id, parent_id, _ = run["result"]["traceparent"].split("-")
    assert (trace_id, parent_id) == (CALLER_TRACE, attempt.span_id)


def test_traces__a_run_without_a_traceparent_starts_its_own(
    traced: tuple[OtlpReceiver, OtelTracing],
    run_traced: Callable[[dict[str, str]], dict[str, Any]],
):
    receiver = traced[0]
    run = run_traced({})
    [http] = receiver.named("POST /v1/runs")
    assert http.parent_span_id == ""  # a root: no caller's context
    [attempt] = receiver.named("attempt")
    assert attempt.trace_id == http.trace_id
    assert run["result"]["traceparent"].split("-")[1] == http.trace_id == run["trace_id"]
