"""The trace context of each traced run, and of its latest attempt's span."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, text

from runyard.platform.db import autocommit
from runyard.platform.tracing import TraceContext, parse_context

# The first context stored for a run stays (a submit's, or a worker's root span if none).
SAVE_RUN_TRACE = text(
    """
    INSERT INTO run_traces (run_id, traceparent, tracestate)
    SELECT id, :traceparent, :tracestate FROM tool_runs WHERE id = :run_id
    ON CONFLICT (run_id) DO NOTHING
    """
)

RUN_TRACE = text(
    "SELECT traceparent, tracestate, attempt, attempt_span FROM run_traces WHERE run_id = :run_id"
)

# An attempt's span, written by the holder of the job's lease only.
SAVE_ATTEMPT_SPAN = text(
    """
    UPDATE run_traces t SET attempt = :attempt, attempt_span = :span
    FROM tool_run_jobs j
    WHERE t.run_id = j.run_id AND j.id = :job_id AND j.lease_token = :token
      AND j.status = 'running'
    """
)


@dataclass(frozen=True)
class RunTrace:
    """A run's trace context, and its latest attempt's span (attempt number and context)."""

    run: TraceContext
    attempt: int | None = None
    attempt_span: TraceContext | None = None


class RunTraces:
    """Reads and writes ``run_traces``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def save(self, run_id: uuid.UUID, context: TraceContext) -> None:
        """Store the run's context unless it has one."""
        params = {
            "run_id": run_id,
            "traceparent": context.traceparent,
            "tracestate": context.tracestate,
        }
        autocommit(self._engine, SAVE_RUN_TRACE, params)

    def get(self, run_id: uuid.UUID) -> RunTrace | None:
        """The run's trace, if it has one."""
        rows = autocommit(self._engine, RUN_TRACE, {"run_id": run_id})
        if not rows:
            return None
        row = rows[0]
        run = parse_context(row.traceparent, row.tracestate)
        if run is None:
            return None
        return RunTrace(run, row.attempt, parse_context(row.attempt_span))

    def save_attempt(
        self, job_id: uuid.UUID, token: uuid.UUID, attempt: int, span: TraceContext
    ) -> None:
        """Record the attempt's span under the job's lease (for a later adopter's link)."""
        params = {"job_id": job_id, "token": token, "attempt": attempt, "span": span.traceparent}
        autocommit(self._engine, SAVE_ATTEMPT_SPAN, params)
