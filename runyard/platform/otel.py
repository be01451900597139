"""The tracing port over OpenTelemetry: spans kept as plain records while open, handed to the
SDK's batch processor and exporter as finished spans when they end.

An attempt's span sites run on the worker's hot path, where the SDK's own spans cost more
than a no-op job's bookkeeping (a lock and a validation per attribute, nested context
managers, an object per event). A record costs a few field writes; the SDK's sampler,
batching (``OTEL_BSP_*``), resource and exporters are used as they are.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import random
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from runyard.platform.tracing import Attributes, Span, TraceContext

# The SDK's default limits of a span's attributes, events and links: a long-lived span (a
# sandbox's) keeps the first ones.
MAX_ITEMS = 128
MAX_STATUS_MESSAGE = 500
DEFAULT_SAMPLERS = ("", "parentbased_always_on")


class _Record:
    """An open span: its ids, its parent's, and what it has gathered so far."""

    __slots__ = (
        "attributes",
        "events",
        "flags",
        "kind",
        "links",
        "name",
        "parent",
        "span_id",
        "start",
        "status",
        "trace_id",
        "tracestate",
    )

    def __init__(
        self,
        name: str,
        trace_id: int,
        parent: tuple[int, bool] | None,
        flags: int,
        tracestate: str,
        kind: int,
        start: int,
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = _new_id(64)
        self.parent = parent  # the parent's span id, and whether it came from elsewhere
        self.flags = flags
        self.tracestate = tracestate
        self.kind = kind
        self.start = start
        self.attributes: dict[str, str | int | float | bool] = {}
        self.events: list[tuple[str, Attributes | None, int]] = []
        self.links: list[TraceContext] = []
        self.status: str | None = None

    @property
    def sampled(self) -> bool:
        """Whether the span is recorded and exported (else only its context travels)."""
        return bool(self.flags & 1)

    def context(self) -> TraceContext:
        """The span's W3C context."""
        parent = f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"
        return TraceContext(parent, self.tracestate)

    def set(self, key: str, value: str | int | float | bool) -> None:
        """Set an attribute (past the limit, only those already set change)."""
        if key in self.attributes or len(self.attributes) < MAX_ITEMS:
            self.attributes[key] = value

    def event(self, name: str, attributes: Attributes | None) -> None:
        """Add an event, now (past the limit, none)."""
        if len(self.events) < MAX_ITEMS:
            self.events.append((name, attributes, time.time_ns()))


class _RecordSpan:
    """The ``Span`` a caller holds: writes go to the record."""

    __slots__ = ("_record",)

    def __init__(self, record: _Record) -> None:
        self._record = record

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._record.set(key, value)

    def fail(self, message: str) -> None:
        self._record.status = message[:MAX_STATUS_MESSAGE]

    def rename(self, name: str) -> None:
        self._record.name = name

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self._record.event(name, attributes)

    def context(self) -> TraceContext | None:
        return self._record.context()


# The span open in this thread (or task).
_OPEN: contextvars.ContextVar[_Record | None] = contextvars.ContextVar("runyard_span", default=None)


def _new_id(bits: int) -> int:
    """A random, non-zero trace or span id (as the SDK's id generator makes them)."""
    while not (value := random.getrandbits(bits)):
        pass
    return value


class OtelTracing:
    """Spans exported through the OpenTelemetry SDK, batched to the exporter ``OTEL_*``
    names (or the one given)."""

    enabled = True

    def __init__(self, service_name: str, exporter: Any) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from runyard.platform.otel_export import Finisher

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name; the
        # sampler comes from OTEL_TRACES_SAMPLER (parent-based, always on, by default), the
        # batch's size and delay from OTEL_BSP_*.
        resource = Resource.create({"service.name": service_name})
        self._sampler = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
        # The SDK's batching, typed loosely: its shutdown is not annotated.
        self._processor: Any = BatchSpanProcessor(exporter)
        self._finish = Finisher(resource, self._processor.on_end)
        # Parent-based and always on (the default) needs no call: a root is sampled, a
        # child is as its parent.
        chosen = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
        self._default_sampling = chosen in DEFAULT_SAMPLERS

    def _open(
        self,
        name: str,
        parent: TraceContext | None,
        links: Sequence[TraceContext],
        attributes: Attributes | None,
        server: bool,
        start: int,
    ) -> _Record:
        """A record for a new span, child of ``parent`` (else of the span open here)."""
        kind = 1 if server else 0
        if parent is not None:
            _, trace_hex, span_hex, flags_hex = parent.traceparent.split("-")
            trace_id, flags = int(trace_hex, 16), int(flags_hex, 16) & 1
            up: tuple[int, bool] | None = (int(span_hex, 16), True)
            state = parent.tracestate
        elif (local := _OPEN.get()) is not None:
            trace_id, flags, state = local.trace_id, local.flags, local.tracestate
            up = (local.span_id, False)
        else:
            trace_id, flags, up, state = _new_id(128), 1, None, ""
        if not self._default_sampling:
            flags = self._sample(name, trace_id, up, flags, state, kind, attributes)
        record = _Record(name, trace_id, up, flags, state, kind, start)
        if attributes:
            record.attributes.update(attributes)
        if links:
            record.links.extend(links[:MAX_ITEMS])
        return record

    def _sample(
        self,
        name: str,
        trace_id: int,
        up: tuple[int, bool] | None,
        flags: int,
        state: str,
        kind: int,
        attributes: Attributes | None,
    ) -> int:
        """The configured sampler's decision (1: sampled), given the parent's context."""
        parent_context = None
        if up is not None:
            remote = self._finish.span_context(trace_id, up[0], flags, state, remote=up[1])
            parent_context = self._finish.context_of(remote)
        result = self._sampler.should_sample(
            parent_context, trace_id, name, self._finish.kinds[kind], attributes, None
        )
        return 1 if result.decision is self._finish.record_and_sample else 0

    def _end(self, record: _Record, end: int) -> None:
        if record.sampled:
            self._finish(record, end)

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
        """A span, current in this thread while open."""
        record = self._open(name, parent, links, attributes, server, time.time_ns())
        token = _OPEN.set(record)
        try:
            yield _RecordSpan(record)
        except Exception as exc:
            record.status = f"{type(exc).__name__}: {exc}"[:MAX_STATUS_MESSAGE]
            raise
        finally:
            _OPEN.reset(token)
            self._end(record, time.time_ns())

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
        began = _nanoseconds(start)
        record = self._open(name, parent, links, attributes, False, began)
        if failed is not None:
            record.status = failed[:MAX_STATUS_MESSAGE]
        self._end(record, max(_nanoseconds(end), began))
        return record.context()

    def current(self) -> TraceContext | None:
        """The context of the span open in this thread, if any."""
        record = _OPEN.get()
        return None if record is None else record.context()

    def link(self, context: TraceContext) -> None:
        """Link the span open in this thread to ``context``."""
        record = _OPEN.get()
        if record is not None and len(record.links) < MAX_ITEMS:
            record.links.append(context)

    def tag(self, key: str, value: str | int | float | bool) -> None:
        """Set an attribute of the span open in this thread (none open: nothing)."""
        record = _OPEN.get()
        if record is not None:
            record.set(key, value)

    def span_event(self, name: str, attributes: Attributes | None = None) -> None:
        """An event of the span open in this thread (none open: nothing)."""
        record = _OPEN.get()
        if record is not None:
            record.event(name, attributes)

    def shutdown(self) -> None:
        """Export the spans still batched, then stop the exporter."""
        self._processor.shutdown()


def _nanoseconds(moment: datetime) -> int:
    """A moment as the SDK's span times: nanoseconds since the epoch."""
    return int(moment.timestamp() * 1_000_000_000)
