"""A completion webhook's delivery is a span of its run's trace when tracing is on."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from sqlalchemy import Engine

from runyard.platform.otel import OtelTracing
from runyard.platform.tracing import NO_TRACING, TraceContext, install
from runyard.queue import JobQueue
from runyard.traces.context import with_trace
from runyard.webhooks.delivery import WebhookDeliverer
from runyard.webhooks.tenant import TenantWebhooks
from tests.integration.queue.test_webhooks import FAST, finish
from tests.otlp_receiver import otlp_receiver
from tests.webhook_receiver import Receiver

RUN_SPAN = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def test_webhook_delivery__is_a_span_of_the_runs_trace(
    queue: JobQueue, engine: Engine, receiver: Receiver
):
    assert TenantWebhooks(engine).configure("acme", None).secret is not None  # signs it
    spec = with_trace({"name": "echo", "image": "runyard/toolbox:latest"}, RUN_SPAN)
    run_id = finish(queue, now=None, callback_url=receiver.url, spec=spec)
    with otlp_receiver() as spans:
        tracing = OtelTracing("runyard-reaper", OTLPSpanExporter(endpoint=f"{spans.url}/v1/traces"))
        install(tracing)
        deliverer = WebhookDeliverer(engine, FAST)
        try:
            assert deliverer.run_once().delivered == 1
        finally:
            deliverer.close()
            install(NO_TRACING)
            tracing.shutdown()
        [delivery] = spans.named("webhook.delivery")
    assert (delivery.trace_id, delivery.parent_span_id) == (RUN_SPAN.trace_id, RUN_SPAN.span_id)
    assert delivery.attributes["http.response.status_code"] == 200
    assert delivery.attributes["runyard.run_id"] == str(run_id)
