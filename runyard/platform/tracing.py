"""Traces: a small port over OpenTelemetry, set up only by an entry point, only when the
standard ``OTEL_*`` variables name an exporter; otherwise nothing of the SDK is imported and
every span is a shared object that does nothing.

Contexts cross process boundaries as W3C ``traceparent``/``tracestate`` strings (a run's is
stored with the run, an attempt's with its job), so spans of the API, the worker that ran an
attempt and the one that adopted it after a crash join one trace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

logger = logging.getLogger(__name__)

# version 00, a 32-hex trace id and a 16-hex span id (neither all zeros), flags.
_TRACEPARENT = re.compile(r"00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-[0-9a-f]{2}")
MAX_TRACESTATE = 512
Attributes = Mapping[str, str | int | float | bool]


@dataclass(frozen=True)
class TraceContext:
    """A span's context as W3C trace-context headers carry it."""

    traceparent: str
    tracestate: str = ""

    @property
    def trace_id(self) -> str:
        """The 32-hex trace id."""
        return self.traceparent.split("-")[1]

    @property
    def span_id(self) -> str:
        """The 16-hex span id."""
        return self.traceparent.split("-")[2]

    def env(self) -> dict[str, str]:
        """``TRACEPARENT`` (and ``TRACESTATE``) for a process that joins the trace."""
        env = {"TRACEPARENT": self.traceparent}
        if self.tracestate:
            env["TRACESTATE"] = self.tracestate
        return env


def parse_context(traceparent: str | None, tracestate: str | None = None) -> TraceContext | None:
    """A caller's ``traceparent`` (and ``tracestate``) if well formed, else None: a bad header
    is ignored, as W3C trace context asks."""
    if not traceparent:
        return None
    value = traceparent.strip().lower()
    if len(value) != 55 or not _TRACEPARENT.fullmatch(value):
        return None
    state = (tracestate or "").strip()
    if len(state) > MAX_TRACESTATE or not state.isprintable():
        state = ""
    return TraceContext(value, state)


class Span(Protocol):
    """An open span."""

    def set(self, key: str, value: str | int | float | bool) -> None:
        """Set an attribute."""
        ...

    def fail(self, message: str) -> None:
        """Mark the span as failed."""
        ...

    def rename(self, name: str) -> None:
        """Name the span after what it turned out to be (a request's route)."""
        ...

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        """Record a moment of the span (cheaper than a span of its own)."""
        ...

    def context(self) -> TraceContext | None:
        """This span's context (None when tracing is off)."""
        ...


class Tracing(Protocol):
    """Where spans are made."""

    enabled: bool

    def span(
        self,
        name: str,
        *,
        parent: TraceContext | None = None,
        links: Sequence[TraceContext] = (),
        attributes: Attributes | None = None,
        server: bool = False,
    ) -> contextlib.AbstractContextManager[Span]:
        """A span, child of ``parent`` if given, else of the span open in this thread."""
        ...

    def record(
        self,
        name: str,
        *,
        start: datetime,
        end: datetime,
        parent: TraceContext | None = None,
        links: Sequence[TraceContext] = (),
        attributes: Attributes | None = None,
        failed: str | None = None,
    ) -> TraceContext | None:
        """A span whose times are known only afterwards (a wait, a command another process
        ran), child of ``parent`` or of the span open in this thread; its context."""
        ...

    def current(self) -> TraceContext | None:
        """The context of the span open in this thread, if any."""
        ...

    def link(self, context: TraceContext) -> None:
        """Link the span open in this thread to ``context`` (e.g. a dead owner's span)."""
        ...

    def span_event(self, name: str, attributes: Attributes | None = None) -> None:
        """An event of the span open in this thread: a moment worth less than a span."""
        ...

    def shutdown(self) -> None:
        """Export what is left and stop."""
        ...


class _NoSpan:
    def set(self, key: str, value: str | int | float | bool) -> None:
        return None

    def fail(self, message: str) -> None:
        return None

    def rename(self, name: str) -> None:
        return None

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        return None

    def context(self) -> TraceContext | None:
        return None


NO_SPAN = _NoSpan()


class NoTracing:
    """Tracing off: every span is ``NO_SPAN``; nothing is imported, nothing is recorded."""

    enabled = False

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        *,
        parent: TraceContext | None = None,
        links: Sequence[TraceContext] = (),
        attributes: Attributes | None = None,
        server: bool = False,
    ) -> Iterator[Span]:
        """``NO_SPAN``."""
        yield NO_SPAN

    def record(
        self,
        name: str,
        *,
        start: datetime,
        end: datetime,
        parent: TraceContext | None = None,
        links: Sequence[TraceContext] = (),
        attributes: Attributes | None = None,
        failed: str | None = None,
    ) -> TraceContext | None:
        """Nothing recorded."""
        return None

    def current(self) -> TraceContext | None:
        """None."""
        return None

    def link(self, context: TraceContext) -> None:
        """Nothing to link."""
        return None

    def span_event(self, name: str, attributes: Attributes | None = None) -> None:
        """Nothing to note."""
        return None

    def shutdown(self) -> None:
        """Nothing to stop."""
        return None


NO_TRACING = NoTracing()


class _OtelSpan:
    __slots__ = ("_span", "_tracing")

    def __init__(self, span: Any, tracing: OtelTracing) -> None:
        self._span = span
        self._tracing = tracing

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._span.set_attribute(key, value)

    def fail(self, message: str) -> None:
        self._span.set_status(self._tracing.error_status(message[:500]))

    def rename(self, name: str) -> None:
        self._span.update_name(name)

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self._span.add_event(name, attributes=attributes)

    def context(self) -> TraceContext | None:
        return self._tracing.context_of(self._span)


class OtelTracing:
    """Spans through the OpenTelemetry SDK, batched to the exporter ``OTEL_*`` names."""

    enabled = True

    def __init__(self, service_name: str, exporter: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
        from opentelemetry.trace.span import NonRecordingSpan, TraceFlags, TraceState

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name; the
        # sampler comes from OTEL_TRACES_SAMPLER (parent-based, always on, by default), the
        # batch's size and delay from OTEL_BSP_*.
        resource = _hashed_once(Resource.create({"service.name": service_name}))
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("runyard")
        self._trace = trace
        # Looked up once: a span site runs on the hot path of every attempt.
        self._context = context
        self._link_type = Link
        self._span_context = SpanContext
        self._non_recording = NonRecordingSpan
        self._flags = TraceFlags
        self._state = TraceState
        self._kinds = (SpanKind.INTERNAL, SpanKind.SERVER)
        self._status = (Status, StatusCode.ERROR)

    def error_status(self, message: str) -> Any:
        """An SDK error status carrying ``message``."""
        status, error = self._status
        return status(error, message)

    def _span_context_of(self, carried: TraceContext) -> Any:
        """The SDK's remote span context of a well-formed W3C context, parsed directly (the
        propagator's regular expressions and carrier lookups cost more than the span)."""
        _, trace_id, span_id, flags = carried.traceparent.split("-")
        state = self._state.from_header([carried.tracestate]) if carried.tracestate else None
        return self._span_context(
            trace_id=int(trace_id, 16),
            span_id=int(span_id, 16),
            is_remote=True,
            trace_flags=self._flags(int(flags, 16)),
            trace_state=state,
        )

    def context_of(self, span: Any) -> TraceContext | None:
        """The W3C context of an SDK span (formatted directly: no propagator on this path)."""
        context = span.get_span_context()
        if not context.is_valid:
            return None
        parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        return TraceContext(parent, context.trace_state.to_header() if context.trace_state else "")

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        *,
        parent: TraceContext | None = None,
        links: Sequence[TraceContext] = (),
        attributes: Attributes | None = None,
        server: bool = False,
    ) -> Iterator[Span]:
        """An SDK span, current in this thread while open (started, attached and ended here
        rather than through the SDK's nested context managers: a third of the cost)."""
        context = None
        if parent is not None:
            remote = self._non_recording(self._span_context_of(parent))
            context = self._trace.set_span_in_context(remote)
        span_links = [self._link_type(self._span_context_of(link)) for link in links]
        span = self._tracer.start_span(
            name,
            context=context,
            kind=self._kinds[server],
            attributes=attributes,
            links=span_links,
            record_exception=False,
            set_status_on_exception=False,
        )
        token = self._context.attach(self._trace.set_span_in_context(span))
        try:
            yield _OtelSpan(span, self)
        except Exception as exc:
            if span.is_recording():
                span.set_status(self.error_status(f"{type(exc).__name__}: {exc}"[:500]))
            raise
        finally:
            self._context.detach(token)
            span.end()

    def record(
        self,
        name: str,
        *,
        start: datetime,
        end: datetime,
        parent: TraceContext | None = None,
        links: Sequence[TraceContext] = (),
        attributes: Attributes | None = None,
        failed: str | None = None,
    ) -> TraceContext | None:
        """A span that already happened (its times known afterwards), ended at once."""
        context = None
        if parent is not None:
            remote = self._non_recording(self._span_context_of(parent))
            context = self._trace.set_span_in_context(remote)
        span = self._tracer.start_span(
            name,
            context=context,
            attributes=attributes,
            links=[self._link_type(self._span_context_of(link)) for link in links],
            start_time=_nanoseconds(start),
        )
        if failed is not None:
            span.set_status(self.error_status(failed[:500]))
        span.end(end_time=max(_nanoseconds(end), _nanoseconds(start)))
        return self.context_of(span)

    def current(self) -> TraceContext | None:
        """The context of the span open in this thread, if any."""
        span = self._trace.get_current_span()
        if not span.get_span_context().is_valid:
            return None
        return self.context_of(span)

    def link(self, context: TraceContext) -> None:
        """Link the span open in this thread to ``context``."""
        span = self._trace.get_current_span()
        if span.get_span_context().is_valid:
            span.add_link(self._span_context_of(context))

    def span_event(self, name: str, attributes: Attributes | None = None) -> None:
        """An event of the span open in this thread (none open: nothing)."""
        self._trace.get_current_span().add_event(name, attributes=attributes)

    def shutdown(self) -> None:
        """Export the spans still batched, then stop the exporter."""
        self._provider.shutdown()


def _hashed_once(resource: Any) -> Any:
    """``resource`` whose hash is computed once: the OTLP encoder groups each exported span by
    its resource, and the SDK's hash serializes the attributes to JSON every time (a fifth of
    the encoding's CPU)."""
    from opentelemetry.sdk.resources import Resource

    class _Hashed(Resource):
        def __init__(self, attributes: Any, schema_url: str | None = None) -> None:
            super().__init__(attributes, schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

    return _Hashed(resource.attributes, resource.schema_url)


def _nanoseconds(moment: datetime) -> int:
    """A moment as the SDK's span times: nanoseconds since the epoch."""
    return int(moment.timestamp() * 1_000_000_000)


def wanted(env: Mapping[str, str]) -> str | None:
    """The exporter the ``OTEL_*`` variables ask for (``otlp`` or ``console``), or None:
    tracing stays off unless an exporter or an OTLP endpoint is named."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter in ("otlp", "console"):
        return exporter
    if exporter:
        return None  # "none", or an exporter this build has not
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return "otlp" if any(env.get(name) for name in endpoints) else None


def from_env(service_name: str, env: Mapping[str, str] | None = None) -> Tracing:
    """The tracing an entry point sets up: ``OtelTracing`` when the environment names an
    exporter, else ``NO_TRACING`` (no SDK set up at all)."""
    env = os.environ if env is None else env
    exporter_name = wanted(env)
    if exporter_name is None:
        return NO_TRACING
    if exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporter: Any = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    logger.info("traces exported", extra={"exporter": exporter_name, "service": service_name})
    return OtelTracing(service_name, exporter)


_installed: list[Tracing] = [NO_TRACING]


def install(tracing: Tracing) -> Tracing:
    """Make ``tracing`` the process's (entry points only); returns the one it replaces."""
    previous = _installed[0]
    _installed[0] = tracing
    return previous


def set_up(service_name: str) -> Tracing:
    """An entry point's one call: the tracing the environment asks for, installed."""
    configured = from_env(service_name)
    install(configured)
    return configured


def tracing() -> Tracing:
    """The process's tracing (``NO_TRACING`` unless an entry point installed one)."""
    return _installed[0]
