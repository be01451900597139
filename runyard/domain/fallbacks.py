"""What an owner stores when it cannot store what the runner gave it (rules, no I/O)."""

from __future__ import annotations

import dataclasses

from runyard.domain.attempt import AttemptResult
from runyard.domain.errors import describe
from runyard.domain.states import ErrorCode, RunStatus

ERROR_CAP = 1000

# What an owner stores for an attempt whose cancel came before its container started.
CANCELLED_BEFORE_START = AttemptResult(
    status=RunStatus.CANCELLED,
    error_code=ErrorCode.CANCELLED,
    error="cancelled before it started",
)


def crashed_outcome(exc: BaseException) -> AttemptResult:
    """``failed``/``internal_error`` for an attempt the runner raised on unexpectedly: the same
    crash would come back on every adoption, so the run ends here instead of looping."""
    return AttemptResult(
        status=RunStatus.FAILED,
        error_code=ErrorCode.INTERNAL,
        error=_cap(f"the attempt could not be run or collected: {describe(exc)}"),
    )


def unstorable_outcomes(outcome: AttemptResult, exc: BaseException) -> list[AttemptResult]:
    """Replacements for an outcome the database refused, safest last: ``failed`` with
    ``internal_error``, no result, and the streams as they were, then cleaned, then dropped."""
    failed = AttemptResult(
        status=RunStatus.FAILED,
        exit_code=outcome.exit_code,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        stdout_truncated=outcome.stdout_truncated,
        stderr_truncated=outcome.stderr_truncated,
        error_code=ErrorCode.INTERNAL,
        error=_cap(f"the outcome could not be stored: {describe(exc)}"),
        image_digest=outcome.image_digest,
    )
    cleaned = dataclasses.replace(
        failed,
        stdout=storable_text(outcome.stdout),
        stderr=storable_text(outcome.stderr),
        image_digest=None if outcome.image_digest is None else storable_text(outcome.image_digest),
    )
    bare = dataclasses.replace(
        failed,
        exit_code=None,
        stdout="",
        stderr="",
        stdout_truncated=outcome.stdout_truncated or bool(outcome.stdout),
        stderr_truncated=outcome.stderr_truncated or bool(outcome.stderr),
        image_digest=None,
    )
    return [failed, cleaned, bare]


def storable_text(text: str) -> str:
    """Text Postgres accepts: no NUL, no unpaired surrogates (both become U+FFFD)."""
    if isinstance(text, str):
        cleaned = text.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")
        return cleaned.replace("\x00", "\ufffd")
    return str(text)


def _cap(text: str) -> str:
    text = storable_text(text)
    return text if len(text) <= ERROR_CAP else text[: ERROR_CAP - 3] + "..."
