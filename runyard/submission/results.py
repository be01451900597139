"""How a submit ended, as the ``result`` label of ``runyard_api_submissions`` counts it."""

from __future__ import annotations

from runyard.domain.graph import GraphProblem
from runyard.queue.graph import BatchRetried
from runyard.queue.values import AdmissionRefused, IdempotencyConflict
from runyard.submission.request import InvalidInput, UnknownTool

# What the caller got wrong: the request itself is refused, whatever the platform's state.
REQUEST_ERRORS: tuple[type[Exception], ...] = (
    UnknownTool,
    InvalidInput,
    IdempotencyConflict,
    GraphProblem,
    BatchRetried,
)


def submission_result(
    error: BaseException | None,
    *,
    created: bool = True,
    request_errors: tuple[type[Exception], ...] = REQUEST_ERRORS,
) -> str:
    """``created`` or ``replayed`` (an idempotent repeat) for a submit that succeeded;
    ``refused`` (an admission cap), ``rejected`` (one of ``request_errors``, itself or as the
    cause: unknown tool, bad input, idempotency conflict, a bad graph, a batch retried twice)
    or ``error`` for one that did not."""
    if error is None:
        return "created" if created else "replayed"
    cause = error.__cause__ if error.__cause__ is not None else error
    if isinstance(error, AdmissionRefused):
        return "refused"
    if isinstance(error, request_errors) or isinstance(cause, request_errors):
        return "rejected"
    return "error"
