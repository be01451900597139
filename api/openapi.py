"""The OpenAPI document: every error response is documented as ``application/problem+json``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.problems import PROBLEM_JSON
from api.schemas import ProblemOut

PROBLEM_REF = {"$ref": "#/components/schemas/ProblemOut"}


def problem(description: str, *, retry_after: bool = False) -> dict[str, Any]:
    """A documented error response of a route (its body is a ``ProblemOut``)."""
    doc: dict[str, Any] = {"model": ProblemOut, "description": description}
    if retry_after:
        doc["headers"] = {
            "Retry-After": {
                "description": "Seconds to wait before retrying",
                "schema": {"type": "integer"},
            }
        }
    return doc


# Errors any authenticated /v1 route may answer.
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    400: problem("Malformed request (e.g. a NUL character in the query)"),
    401: problem("Missing, unknown or revoked API key"),
    422: problem("A parameter or the body failed validation; `field` names it"),
    503: problem("The database is unavailable", retry_after=True),
}

# Errors of routes that take a JSON body.
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    413: problem("The body is larger than RUNYARD_MAX_REQUEST_BYTES"),
    415: problem("The body is not application/json"),
}


def _rewrite(document: dict[str, Any]) -> dict[str, Any]:
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            for status, response in operation.get("responses", {}).items():
                if not str(status).isdigit() or int(status) < 400:
                    continue
                response["content"] = {PROBLEM_JSON: {"schema": PROBLEM_REF}}
    return document


def install_openapi(app: FastAPI) -> None:
    """Replace ``app.openapi`` with a cached generator that applies ``_rewrite``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = _rewrite(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
