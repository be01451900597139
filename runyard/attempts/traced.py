"""An attempt's span: a child of the trace context its run's snapshot carries (else a root of
its own). Nothing is read or written for it: the context comes with the claimed job, and an
adopter links to the dead owner's span from the TRACEPARENT of the container it adopts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from sqlalchemy.exc import DBAPIError

from runyard.platform.tracing import parse_context, tracing
from runyard.queue import ClaimedJob
from runyard.queue.builds import BuildQueue
from runyard.traces.context import trace_of

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def traced_attempt(job: ClaimedJob, owner_id: str) -> Iterator[None]:
    """Hold the attempt's span open in this thread while the owner has the attempt."""
    traced = tracing()
    if not traced.enabled:
        yield
        return
    attributes: dict[str, str | int | float | bool] = {
        "runyard.run_id": str(job.run_id),
        "runyard.attempt": job.attempt,
        "runyard.worker_id": owner_id,
    }
    if job.adopted:  # only then: each attribute costs every attempt's export
        attributes["runyard.adopted"] = True
    # The span starts at the claim: neither a span nor an event of its own is needed for it
    # (each costs the worker CPU per attempt, to make and to export).
    with traced.span("attempt", parent=trace_of(job.spec), attributes=attributes):
        yield


def trace_finalize(status: str) -> None:
    """The finalize as a moment of the attempt's span (open in this thread), its outcome as an
    attribute: not a span of its own, which would cost the worker CPU per attempt to make and
    to export (the attribute is where a trace viewer can search it; the event carries none)."""
    traced = tracing()
    traced.tag("runyard.status", status)
    traced.span_event("finalize")


def trace_build_wait(job: ClaimedJob, engine_id: Callable[[], str], builds: BuildQueue) -> None:
    """A ``build.wait`` span in the attempt's (open in this thread): from the run's submit
    until its image was ready on this engine, linked to the span of the build that made it.
    Only for a first, fresh attempt of a built tool, only with tracing on (one read); it
    starts before its parent, whose attempt could only be claimed once the wait was over."""
    traced = tracing()
    build = job.spec.get("build") if isinstance(job.spec, dict) else None
    tag = build.get("tag") if isinstance(build, dict) else None
    if not traced.enabled or not isinstance(tag, str) or job.attempt != 1 or job.adopted:
        return
    try:
        wait = builds.wait_of(job.run_id, tag, engine_id())
    except DBAPIError as exc:  # a span is never worth failing the attempt for
        logger.debug("build wait not traced", extra={"error": str(exc)})
        return
    if wait is None or wait.ready_at <= wait.queued_at:
        return
    built = parse_context(wait.traceparent)
    traced.record(
        "build.wait",
        start=wait.queued_at,
        end=wait.ready_at,
        links=() if built is None else (built,),
        attributes={"runyard.build.tag": tag},
    )
