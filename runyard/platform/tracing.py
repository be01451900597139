"""Traces: a small port over OpenTelemetry (``runyard.platform.otel``), set up only by an
entry point (``runyard.platform.trace_setup``), only when the standard ``OTEL_*`` variables
name an exporter; otherwise nothing of the SDK is imported and every span is a shared object
that does nothing.

Contexts cross process boundaries as W3C ``traceparent``/``tracestate`` strings (a run's is
stored with the run, an attempt's with its job), so spans of the API, the worker that ran an
attempt and the one that adopted it after a crash join one trace.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

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

    def tag(self, key: str, value: str | int | float | bool) -> None:
        """Set an attribute of the span open in this thread (none open: nothing)."""
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

    def tag(self, key: str, value: str | int | float | bool) -> None:
        """Nothing to set."""
        return None

    def span_event(self, name: str, attributes: Attributes | None = None) -> None:
        """Nothing to note."""
        return None

    def shutdown(self) -> None:
        """Nothing to stop."""
        return None


NO_TRACING = NoTracing()


_installed: list[Tracing] = [NO_TRACING]


def install(tracing: Tracing) -> Tracing:
    """Make ``tracing`` the process's (entry points only); returns the one it replaces."""
    previous = _installed[0]
    _installed[0] = tracing
    return previous


def tracing() -> Tracing:
    """The process's tracing (``NO_TRACING`` unless an entry point installed one)."""
    return _installed[0]
