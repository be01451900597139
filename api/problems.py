"""RFC 9457 problem responses for every error the API returns."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

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


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    errors = []
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ())]
        errors.append({"field": ".".join(loc), "message": err.get("msg", "invalid")})
    return errors


def install_problem_handlers(app: FastAPI) -> None:
    """Every error path of the app answers with ``application/problem+json``."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc.status, exc.code, exc.detail, exc.headers, **exc.extra)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return problem_response(exc.status_code, code, detail, dict(exc.headers or {}))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = _validation_errors(exc)
        first = errors[0] if errors else {"field": "", "message": "invalid request"}
        detail = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
        return problem_response(422, "validation_error", detail, errors=errors)

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
