"""An attempt's span: a child of its run's trace context, linked to the span of the owner it
was adopted from, and stored for the next one. Tracing never fails an attempt: a database
error here only leaves the span without its parent or link."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from runyard.domain.errors import describe
from runyard.platform.tracing import Attributes, TraceContext, tracing
from runyard.queue import ClaimedJob
from runyard.traces.store import RunTrace, RunTraces

logger = logging.getLogger(__name__)


def _run_trace(traces: RunTraces, job: ClaimedJob) -> RunTrace | None:
    """The run's stored trace; a run submitted without one gets a root span of its own."""
    stored = traces.get(job.run_id)
    if stored is not None:
        return stored
    with tracing().span("run", attributes={"runyard.run_id": str(job.run_id)}) as root:
        context = root.context()
    if context is not None:
        traces.save(job.run_id, context)
    return traces.get(job.run_id)  # whichever process stored first


@contextlib.contextmanager
def traced_attempt(traces: RunTraces, job: ClaimedJob, owner_id: str) -> Iterator[None]:
    """Hold the attempt's span open in this thread while the owner has the attempt."""
    traced = tracing()
    if not traced.enabled:
        yield
        return
    stored: RunTrace | None = None
    try:
        stored = _run_trace(traces, job)
    except Exception as exc:
        logger.warning("run trace unavailable", extra={"error": describe(exc)})
    links: list[TraceContext] = []
    if (
        job.adopted
        and stored is not None
        and stored.attempt == job.attempt
        and stored.attempt_span is not None
    ):
        links.append(stored.attempt_span)  # the dead owner's span of this same attempt
    attributes: Attributes = {
        "runyard.run_id": str(job.run_id),
        "runyard.attempt": job.attempt,
        "runyard.adopted": job.adopted,
        "runyard.worker_id": owner_id,
    }
    parent = stored.run if stored is not None else None
    with traced.span("attempt", parent=parent, links=links, attributes=attributes) as span:
        with traced.span("claim", attributes={"runyard.adopted": job.adopted}):
            pass
        context = span.context()
        if context is not None:
            try:
                traces.save_attempt(job.job_id, job.lease_token, job.attempt, context)
            except Exception as exc:
                logger.warning("attempt span not stored", extra={"error": describe(exc)})
        yield
