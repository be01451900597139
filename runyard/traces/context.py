"""A run's W3C trace context in its snapshot (``spec``): written at the submit, read by each
owner from the claimed job, shown as the run's trace id."""

from __future__ import annotations

from typing import Any

from runyard.platform.tracing import TraceContext, parse_context

# The snapshot's key; the registry refuses unknown keys, so no tool definition has it.
SPEC_KEY = "trace_context"


def with_trace(spec: dict[str, Any], context: TraceContext) -> dict[str, Any]:
    """``spec`` carrying ``context``."""
    return {
        **spec,
        SPEC_KEY: {"traceparent": context.traceparent, "tracestate": context.tracestate},
    }


def trace_of(spec: Any) -> TraceContext | None:
    """The trace context a run's snapshot carries, if any (a malformed one is none)."""
    if not isinstance(spec, dict):
        return None
    carried = spec.get(SPEC_KEY)
    if not isinstance(carried, dict):
        return None
    parent, state = carried.get("traceparent"), carried.get("tracestate")
    if not isinstance(parent, str):
        return None
    return parse_context(parent, state if isinstance(state, str) else None)
