"""Finished span records as the OpenTelemetry SDK's spans, for its batch processor and
exporters (imported only when tracing is on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceFlags, TraceState

from runyard.platform.tracing import TraceContext

if TYPE_CHECKING:
    from runyard.platform.otel import _Record

KINDS = (SpanKind.INTERNAL, SpanKind.SERVER)
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
UNSET = Status(StatusCode.UNSET)


class Finisher:
    """Makes each ended record a ``ReadableSpan`` and hands it to ``on_end``; the SDK's
    names a sampler's call needs, too."""

    kinds = KINDS
    record_and_sample = Decision.RECORD_AND_SAMPLE

    def __init__(self, resource: Resource, on_end: Callable[[ReadableSpan], None]) -> None:
        self._resource = _hashed_once(resource)
        self._scope = InstrumentationScope("runyard")
        self._on_end = on_end
        self._states: dict[str, TraceState] = {}

    def _state(self, header: str) -> TraceState | None:
        """The SDK's trace state of a ``tracestate`` header (the few seen are kept parsed)."""
        if not header:
            return None
        state = self._states.get(header)
        if state is None:
            state = TraceState.from_header([header])
            if len(self._states) < 64:
                self._states[header] = state
        return state

    def span_context(
        self, trace_id: int, span_id: int, flags: int, state: str, *, remote: bool
    ) -> SpanContext:
        """The SDK's context of a span."""
        return SpanContext(
            trace_id=trace_id,
            span_id=span_id,
            is_remote=remote,
            trace_flags=SAMPLED if flags & 1 else TraceFlags(0),
            trace_state=self._state(state),
        )

    @staticmethod
    def context_of(parent: SpanContext) -> Context:
        """An SDK context whose current span is ``parent`` (what a sampler is given)."""
        return set_span_in_context(NonRecordingSpan(parent))

    def _link(self, carried: TraceContext) -> Link:
        _, trace_id, span_id, flags = carried.traceparent.split("-")
        context = self.span_context(
            int(trace_id, 16), int(span_id, 16), int(flags, 16), carried.tracestate, remote=True
        )
        return Link(context)

    def __call__(self, record: _Record, end: int) -> None:
        """Hand the ended ``record`` on as the SDK's finished span."""
        parent = None
        if record.parent is not None:
            parent_id, remote = record.parent
            parent = self.span_context(
                record.trace_id, parent_id, record.flags, record.tracestate, remote=remote
            )
        status = UNSET if record.status is None else Status(StatusCode.ERROR, record.status)
        span = ReadableSpan(
            name=record.name,
            context=self.span_context(
                record.trace_id, record.span_id, record.flags, record.tracestate, remote=False
            ),
            parent=parent,
            resource=self._resource,
            # Copied: a handle kept past its span's end must not change what is exported.
            attributes=dict(record.attributes),
            events=[Event(name, attributes, at) for name, attributes, at in record.events],
            links=[self._link(link) for link in record.links],
            kind=KINDS[record.kind],
            status=status,
            start_time=record.start,
            end_time=end,
            instrumentation_scope=self._scope,
        )
        self._on_end(span)


def _hashed_once(resource: Resource) -> Resource:
    """``resource`` whose hash is computed once: the OTLP encoder groups each exported span by
    its resource, and the SDK's hash serializes the attributes to JSON every time (a fifth of
    the encoding's CPU)."""

    class _Hashed(Resource):
        def __init__(self, attributes: Any, schema_url: str | None = None) -> None:
            super().__init__(attributes, schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

    return _Hashed(resource.attributes, resource.schema_url)
