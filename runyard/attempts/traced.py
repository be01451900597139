"""An attempt's span: a child of the trace context its run's snapshot carries (else a root of
its own). Nothing is read or written for it: the context comes with the claimed job, and an
adopter links to the dead owner's span from the TRACEPARENT of the container it adopts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from runyard.platform.tracing import Attributes, tracing
from runyard.queue import ClaimedJob
from runyard.traces.context import trace_of


@contextlib.contextmanager
def traced_attempt(job: ClaimedJob, owner_id: str) -> Iterator[None]:
    """Hold the attempt's span open in this thread while the owner has the attempt."""
    traced = tracing()
    if not traced.enabled:
        yield
        return
    attributes: Attributes = {
        "runyard.run_id": str(job.run_id),
        "runyard.attempt": job.attempt,
        "runyard.adopted": job.adopted,
        "runyard.worker_id": owner_id,
    }
    # The span starts at the claim: neither a span nor an event of its own is needed for it
    # (each costs the worker CPU per attempt, to make and to export).
    with traced.span("attempt", parent=trace_of(job.spec), attributes=attributes):
        yield
