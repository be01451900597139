"""RFC 9457 problem responses for every error the API returns."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


class Problem(Exception):
    """An error with an HTTP status, a stable ``code`` and a message a person understands."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra


def problem_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """Render a problem document."""
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


# Errors of the request itself (or of the code): retrying the same request cannot help.
_CALLER_OR_CODE = (
    sa_exc.IntegrityError,
    sa_exc.ProgrammingError,
    sa_exc.DataError,
    sa_exc.NotSupportedError,
    psycopg.IntegrityError,
    psycopg.ProgrammingError,
    psycopg.DataError,
    psycopg.NotSupportedError,
)


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot serve now (503, retry) rather than a bug (500).

    Unreachable, lost or closed connections (``OperationalError``, ``InterfaceError``), an
    exhausted pool (``TimeoutError``), a statement or lock timeout, a server shutting down:
    yes. Constraint, SQL and data errors: no, unless the connection broke with them.
    """
    if isinstance(exc, sa_exc.TimeoutError | sa_exc.DisconnectionError):
        return True
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, sa_exc.DBAPIError | psycopg.Error):
        return not isinstance(exc, _CALLER_OR_CODE)
    return False


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    errors = []
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ())]
        where = loc[0] if loc and loc[0] in ("body", "query", "path", "header") else ""
        field = ".".join(loc[1:] if where else loc)
        errors.append(
            {
                "field": field,
                "in": where,
                "message": str(err.get("msg", "invalid")),
                "type": str(err.get("type", "invalid")),
            }
        )
    return errors


def install_problem_handlers(app: FastAPI, *, db_retry_after_seconds: int = 2) -> None:
    """Every error path of the app answers with ``application/problem+json``; a database that
    cannot serve answers 503 with ``Retry-After: db_retry_after_seconds``."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc.status, exc.code, exc.detail, exc.headers, **exc.extra)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_").replace("-", "_")
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        if exc.status_code == 404:
            detail = f"no route {request.url.path}"
        return problem_response(exc.status_code, code, detail, dict(exc.headers or {}))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = _validation_errors(exc)
        first = errors[0] if errors else {"field": "", "in": "", "message": "invalid request"}
        detail = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
        return problem_response(
            422, "validation_error", detail, field=first["field"], errors=errors
        )

    async def on_database_error(request: Request, exc: Exception) -> JSONResponse:
        if not database_unavailable(exc):
            raise exc  # a bug: the 500 below, with its traceback in the server's log
        logger.warning(
            "database unavailable",
            extra={"path": request.url.path, "error": f"{type(exc).__name__}: {exc}"[:300]},
        )
        return problem_response(
            503,
            "database_unavailable",
            "the database is unavailable; retry later",
            {"Retry-After": str(db_retry_after_seconds)},
        )

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        # Logged with its traceback by the server; the caller gets no internals.
        return problem_response(500, "internal_error", "an unexpected error occurred")

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(sa_exc.DBAPIError, on_database_error)
    app.add_exception_handler(sa_exc.TimeoutError, on_database_error)
    app.add_exception_handler(sa_exc.DisconnectionError, on_database_error)
    app.add_exception_handler(psycopg.Error, on_database_error)
    app.add_exception_handler(Exception, on_crash)
