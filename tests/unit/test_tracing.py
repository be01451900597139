"""The tracing port: W3C context parsing, which OTEL_* settings turn tracing on, and that off
means no SDK at all."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from runyard.platform.otel import OtelTracing
from runyard.platform.trace_setup import from_env, wanted
from runyard.platform.tracing import NO_SPAN, NO_TRACING, TraceContext, parse_context
from runyard.traces.context import trace_of, with_trace

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("header", "state", "expected"),
    [
        (VALID, None, TraceContext(VALID, "")),
        (VALID.upper(), "a=1", TraceContext(VALID, "a=1")),
        (f"  {VALID} ", "x" * 600, TraceContext(VALID, "")),  # an oversized state is dropped
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None, None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None, None),
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None, None),
        (VALID + "-extra", None, None),
        ("not a traceparent", None, None),
        ("", None, None),
        (None, None, None),
    ],
)
def test_parse_context__only_well_formed_w3c_headers(
    header: str | None, state: str | None, expected: TraceContext | None
):
    assert parse_context(header, state) == expected


def test_trace_context__ids_and_the_environment_of_a_child_process():
    context = TraceContext(VALID, "k=v")
    assert (context.trace_id, context.span_id) == (
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "00f067aa0ba902b7",
    )
    assert context.env() == {"TRACEPARENT": VALID, "TRACESTATE": "k=v"}
    assert TraceContext(VALID).env() == {"TRACEPARENT": VALID}


@pytest.mark.parametrize(
    ("env", "exporter"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "x"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h"}, None),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
    ],
)
def test_wanted__tracing_is_off_unless_an_exporter_is_named(
    env: dict[str, str], exporter: str | None
):
    assert wanted(env) == exporter


def test_no_tracing__spans_do_nothing():
    assert from_env("runyard-test", {}) is NO_TRACING
    with NO_TRACING.span("x", attributes={"a": 1}) as span:
        assert span is NO_SPAN and span.context() is None
    assert NO_TRACING.current() is None


@pytest.mark.slow  # a Python process of its own, importing the project
def test_no_tracing__imports_nothing_of_the_sdk():
    # A process with no exporter named: its entry point's set-up leaves the SDK unimported.
    probe = (
        "import sys; from runyard.platform.trace_setup import set_up;"
        "from runyard.platform.tracing import tracing;"
        "set_up('probe');"
        "import api.main, worker.service;"
        "assert not tracing().enabled;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "echo"},
        None,
        {"trace_context": "00-x"},
        {"trace_context": {"traceparent": 7}},
        {"trace_context": {"traceparent": "00-nope-00f067aa0ba902b7-01"}},
    ],
)
def test_trace_of__a_snapshot_without_a_valid_context_has_none(spec: object):
    assert trace_of(spec) is None


def test_with_trace__the_snapshot_carries_the_context_back():
    context = TraceContext(VALID, "k=v")
    spec = with_trace({"name": "echo"}, context)
    assert spec["name"] == "echo" and trace_of(spec) == context


def test_otel_tracing__parents_links_and_recorded_spans_keep_their_ids_and_times():
    exported = InMemorySpanExporter()
    traced = OtelTracing("runyard-test", exported)
    parent = TraceContext(VALID, "vendor=1")
    other = TraceContext("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    start = datetime(2030, 1, 1, tzinfo=UTC)
    with traced.span("outer", parent=parent, links=(other,)) as outer:
        recorded = traced.record(
            "waited", start=start, end=start + timedelta(seconds=2), failed="too long"
        )
        assert traced.current() == outer.context()
        traced.tag("runyard.status", "succeeded")
        traced.span_event("moment", {"n": 1})
    with pytest.raises(ValueError, match="boom"), traced.span("broken"):
        raise ValueError("boom")
    traced.shutdown()
    by_name = {span.name: span for span in exported.get_finished_spans()}
    outer_span, waited = by_name["outer"], by_name["waited"]
    assert outer_span.parent is not None and f"{outer_span.parent.span_id:016x}" == VALID[36:52]
    assert outer_span.context.trace_id == int(parent.trace_id, 16)
    assert outer_span.context.trace_state.to_header() == "vendor=1"
    assert [f"{link.context.span_id:016x}" for link in outer_span.links] == [other.span_id]
    # A recorded span: a child of the span open then, with the times it was given.
    assert waited.parent is not None and waited.parent.span_id == outer_span.context.span_id
    assert (waited.start_time, waited.end_time) == (
        int(start.timestamp() * 1e9),
        int(start.timestamp() * 1e9) + 2_000_000_000,
    )
    assert waited.status.description == "too long"
    assert recorded is not None and recorded.span_id == f"{waited.context.span_id:016x}"
    assert by_name["broken"].status.description == "ValueError: boom"
    assert outer_span.attributes == {"runyard.status": "succeeded"}
    assert [(event.name, event.attributes) for event in outer_span.events] == [("moment", {"n": 1})]
    assert NO_TRACING.record("x", start=start, end=start) is None


def _exporting() -> tuple[OtelTracing, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    return OtelTracing("runyard-test", exported), exported


def test_otel_tracing__a_span_under_an_unsampled_parent_travels_but_is_never_exported():
    traced, exported = _exporting()
    unsampled = TraceContext(VALID[:-2] + "00")
    with traced.span("skipped", parent=unsampled) as skipped:
        child = traced.record("child", start=datetime.now(UTC), end=datetime.now(UTC))
        carried = skipped.context()
    with traced.span("kept"):
        pass
    traced.shutdown()
    assert [span.name for span in exported.get_finished_spans()] == ["kept"]
    assert carried is not None and carried.trace_id == unsampled.trace_id
    assert carried.traceparent.endswith("-00") and carried.span_id != unsampled.span_id
    assert child is not None and child.traceparent.endswith("-00")


@pytest.mark.parametrize(
    ("sampler", "argument", "kept"),
    [
        ("always_off", None, []),
        ("traceidratio", "1.0", ["root"]),
        ("parentbased_always_off", None, []),
    ],
)
def test_otel_tracing__the_configured_sampler_decides(
    monkeypatch: pytest.MonkeyPatch, sampler: str, argument: str | None, kept: list[str]
):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if argument is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", argument)
    traced, exported = _exporting()
    with traced.span("root") as root:
        flags = root.context()
    traced.shutdown()
    assert [span.name for span in exported.get_finished_spans()] == kept
    assert flags is not None and flags.traceparent.endswith("-01" if kept else "-00")


def test_otel_tracing__a_server_span_renamed_failed_and_bounded():
    traced, exported = _exporting()
    with traced.span("request", server=True, attributes={"a": 1}) as span:
        span.rename("GET /v1/runs")
        span.set("http.status_code", 500)
        span.fail("x" * 600)
        for n in range(200):
            span.event("tick", {"n": n})
            traced.link(TraceContext(VALID))
    traced.shutdown()
    (request,) = exported.get_finished_spans()
    assert request.name == "GET /v1/runs" and request.kind == SpanKind.SERVER
    assert dict(request.attributes or {}) == {"a": 1, "http.status_code": 500}
    assert request.status.description == "x" * 500
    assert len(request.events) == 128 and len(request.links) == 128
    assert request.events[0].attributes == {"n": 0}
