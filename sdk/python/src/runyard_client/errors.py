"""Typed errors: the API's problem documents by status, and failures to reach it."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any, ClassVar


class RunyardError(Exception):
    """An error of the API (``status``, its stable ``code`` and a ``detail`` for people), or
    of the client (no ``status``)."""

    default_code: ClassVar[str] = "error"

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        problem: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code or self.default_code}: {detail}" if status else detail)
        self.status = status
        self.code = code or self.default_code
        self.detail = detail
        # The whole problem document: ``field``, ``errors``, ``run_status``, ``limit``, ...
        self.problem: dict[str, Any] = dict(problem or {})
        # Seconds the API asked to wait before trying again (``Retry-After``), if it did.
        self.retry_after = retry_after

    @property
    def field(self) -> str | None:
        """The request field the API blamed, if any."""
        value = self.problem.get("field")
        return value if isinstance(value, str) else None


class InvalidRequestError(RunyardError):
    """The API refused the request itself (400, 413, 415, 416, 422): fix it, do not retry."""


class AuthenticationError(RunyardError):
    """No API key, or an unknown or revoked one (401)."""


class PermissionDeniedError(RunyardError):
    """The key may not do this (403)."""


class NotFoundError(RunyardError):
    """No such run, batch, artifact or route, or it is another tenant's (404)."""


class ConflictError(RunyardError):
    """The resource is not in a state that allows this (409): e.g. cancelling a finished run,
    deleting an unfinished one, or an ``Idempotency-Key`` reused with another request."""


class RateLimitedError(RunyardError):
    """A tenant cap or the sync-mode capacity is full (429); ``retry_after`` says when to
    try again."""


class ServerError(RunyardError):
    """The API failed unexpectedly (500)."""


class UnavailableError(RunyardError):
    """The API cannot serve now: 503 (queue full, database unavailable, too many streams),
    502/504 from a proxy, or no connection at all (no ``status``)."""

    default_code = "unavailable"


class InvalidResponseError(RunyardError):
    """The answer is not one the API gives: an event stream that is not one, or an event
    larger than the client reads; sending the request again would not help."""

    default_code = "invalid_response"


class ArtifactIntegrityError(RunyardError):
    """A download did not match the SHA-256 (or size) the API listed; nothing was kept."""

    default_code = "artifact_mismatch"


class WaitTimeoutError(RunyardError, TimeoutError):
    """A wait ran out of time before the run (or batch) ended; ``last`` is what was seen."""

    default_code = "wait_timeout"

    def __init__(self, detail: str, last: Any) -> None:
        super().__init__(detail)
        self.last = last


_BY_STATUS: dict[int, type[RunyardError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidRequestError,
    415: InvalidRequestError,
    416: InvalidRequestError,
    422: InvalidRequestError,
    429: RateLimitedError,
    500: ServerError,
    502: UnavailableError,
    503: UnavailableError,
    504: UnavailableError,
}
# Answers that may succeed if the same request is sent again a little later.
TRANSIENT_STATUSES = frozenset({502, 503, 504})


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delay-seconds or an HTTP date), or None."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_from_response(status: int, headers: Mapping[str, str], body: bytes) -> RunyardError:
    """The error an answer of 400 or more stands for, from its problem document if it has
    one (a proxy's HTML page gives a generic detail)."""
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else RunyardError)
    problem: dict[str, Any] = {}
    try:
        parsed = json.loads(body) if body else None
        if isinstance(parsed, dict):
            problem = parsed
    except ValueError:
        pass
    code = problem.get("code")
    detail = problem.get("detail") or problem.get("title")
    if not isinstance(detail, str):
        text = body[:200].decode("utf-8", errors="replace").strip()
        detail = text or f"HTTP {status}"
    return kind(
        detail,
        status=status,
        code=code if isinstance(code, str) else f"http_{status}",
        problem=problem,
        retry_after=parse_retry_after(_header(headers, "retry-after")),
    )


def connection_error(exc: BaseException) -> UnavailableError:
    """The error of a request that got no answer (refused, reset, timed out)."""
    return UnavailableError(f"cannot reach the runyard API: {type(exc).__name__}: {exc}")


def is_transient(error: RunyardError) -> bool:
    """Whether sending the same request again later may succeed."""
    if isinstance(error, UnavailableError):
        return error.status is None or error.status in TRANSIENT_STATUSES
    return False


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None
