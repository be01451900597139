"""An OTLP/HTTP trace receiver for tests: a threaded HTTP server on loopback that decodes
every ``POST /v1/traces`` (protobuf, as the SDK's exporter sends it) into plain spans."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

MAX_BODY = 16 << 20


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as exported: ids in hex, its service, attributes and links."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    events: tuple[str, ...] = ()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one export request."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        links=tuple((k.trace_id.hex(), k.span_id.hex()) for k in span.links),
                        events=tuple(event.name for event in span.events),
                    )
                )
    return spans


class OtlpReceiver:
    """The spans received so far."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.url = ""

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        """Every span received (of one trace)."""
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def named(self, name: str, trace_id: str | None = None) -> list[ReceivedSpan]:
        """The spans of that name."""
        return [s for s in self.spans(trace_id) if s.name == name]


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver on a free loopback port; ``receiver.url`` is its base URL."""
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                receiver.add(decode(body))
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def traced_to_receiver(service: str = "runyard-test") -> Iterator[tuple[OtlpReceiver, Any]]:
    """Tracing on in this process, every span exported to a receiver on loopback; off again
    after. Yields the receiver and the ``OtelTracing`` (its ``shutdown`` exports the rest)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from runyard.platform.otel import OtelTracing
    from runyard.platform.tracing import NO_TRACING, install

    with otlp_receiver() as receiver:
        tracing = OtelTracing(service, OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"))
        install(tracing)
        try:
            yield receiver, tracing
        finally:
            install(NO_TRACING)
            tracing.shutdown()
