"""The OpenAPI document: every error response is documented as ``application/problem+json``,
the event streams' items have schemas, and each resource has a tag.

Every route names its operation explicitly (``operation_id="submitRun"`` on its decorator)
rather than through a ``generate_unique_id_function``: the id is the public name of each
function of a generated client, so it is chosen where the route is, greppable, and stays put
when a handler is renamed; tests/unit/test_openapi.py refuses a default-looking one.
"""

from __future__ import annotations

from typing import Any, get_args

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from api.event_schemas import BUILD_EVENT_DATA, RunEvent
from api.problems import PROBLEM_JSON
from api.schemas import ProblemOut

REF_TEMPLATE = "#/components/schemas/{model}"
PROBLEM_REF = {"$ref": "#/components/schemas/ProblemOut"}
NDJSON = "application/x-ndjson"
EVENT_STREAM = "text/event-stream"
# A download's bytes (an artifact, the tar of all).
BINARY: dict[str, Any] = {"type": "string", "format": "binary"}

# The tags, in the order the docs and generated clients list them.
OPENAPI_TAGS: list[dict[str, Any]] = [
    {
        "name": "runs",
        "description": "Submit a run of a registered tool; read, list, cancel, rerun and delete "
        "runs; read a run's logs",
    },
    {
        "name": "events",
        "description": "A run's events: the live, resumable server-sent event stream, or the "
        "NDJSON download of those so far (item schema: `RunEvent`)",
    },
    {"name": "artifacts", "description": "The files a terminal run's tool left, one or all"},
    {
        "name": "batches",
        "description": "Runs submitted as one graph: read, list, cancel and retry them as one",
    },
    {
        "name": "schedules",
        "description": "Recurring schedules: a tool run at each slot of a cron expression or "
        "a period, each slot exactly once; create, read, list, pause, resume and delete them",
    },
    {
        "name": "tools",
        "description": "The tool registry, and building a tool built from source (admin)",
    },
    {"name": "builds", "description": "Builds of the tools built from source, and their logs"},
    {
        "name": "usage",
        "description": "What a tenant's runs consumed (CPU, memory, time, disk, network)",
    },
    {"name": "keys", "description": "API keys: list, create, change and revoke (admin)"},
    {
        "name": "webhooks",
        "description": "A tenant's default completion webhook and its signing secret (admin)",
    },
    {
        "name": "sandboxes",
        "description": "Long-lived containers of a tool: create, exec with streamed output, "
        "read and write files, delete",
    },
    {
        "name": "health",
        "description": "Liveness, readiness and Prometheus metrics; no API key needed",
    },
]


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


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def _sse_message(event: str, id_description: str, data: dict[str, Any]) -> dict[str, Any]:
    """One server-sent event message whose ``event`` is ``event`` and whose ``data`` is JSON."""
    return {
        "type": "object",
        "title": f"{event} message",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": id_description},
            "event": {"const": event},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": data,
            },
        },
    }


def run_event_types() -> dict[str, type[BaseModel]]:
    """Each run event type and the model of its data, from the ``RunEvent`` union."""
    union, _discriminator = get_args(RunEvent)
    found: dict[str, type[BaseModel]] = {}
    for event in get_args(union):
        (kind,) = get_args(event.model_fields["type"].annotation)
        found[kind] = event.model_fields["data"].annotation
    return found


def run_events_content() -> dict[str, Any]:
    """The 200 content of a run's events: the SSE stream and the NDJSON download, each item
    described (OpenAPI 3.2's ``itemSchema``, as FastAPI's own SSE routes write it)."""
    at = {
        "type": "object",
        "required": ["at"],
        "properties": {"at": {"type": "string", "format": "date-time"}},
    }
    messages = [
        _sse_message(
            kind, "The event id (send it back as Last-Event-ID)", {"allOf": [_ref(data), at]}
        )
        for kind, data in run_event_types().items()
    ]
    return {
        EVENT_STREAM: {"schema": {"type": "string"}, "itemSchema": {"oneOf": messages}},
        NDJSON: {
            "schema": {"type": "string"},
            "itemSchema": {"$ref": REF_TEMPLATE.format(model="RunEvent")},
        },
    }


def build_events_content() -> dict[str, Any]:
    """The 200 content of a build's events: SSE messages, ``log`` pieces and ``status``."""
    messages = [
        _sse_message(kind, "Characters of log written so far (Last-Event-ID resumes)", _ref(data))
        for kind, data in BUILD_EVENT_DATA.items()
    ]
    return {EVENT_STREAM: {"schema": {"type": "string"}, "itemSchema": {"oneOf": messages}}}


def event_schemas() -> dict[str, Any]:
    """The component schemas of the event streams' items: ``RunEvent`` (a union on ``type``),
    its members and their data, and the data of a build's events."""
    union = TypeAdapter(RunEvent).json_schema(ref_template=REF_TEMPLATE)
    schemas: dict[str, Any] = union.pop("$defs")
    schemas["RunEvent"] = {
        "title": "RunEvent",
        "description": "One event of a run, by its type: a line of the NDJSON download (an "
        "SSE message carries the same as id, event and data with at). Skip types you do not "
        "know: new ones may come.",
        **union,
    }
    builds = [(model, "validation") for model in BUILD_EVENT_DATA.values()]
    _, found = models_json_schema(builds, ref_template=REF_TEMPLATE)  # type: ignore[arg-type]
    schemas.update(found["$defs"])
    return schemas


def _add_schemas(document: dict[str, Any], added: dict[str, Any]) -> None:
    """Add component schemas; one of the same name must be the same (a route's is kept)."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in added.items():
        if name in schemas and schemas[name] != schema:
            raise RuntimeError(f"two different component schemas are named {name!r}")
        schemas[name] = schema


def _drop_made_up_titles(response: dict[str, Any]) -> None:
    """FastAPI titles an inline answer after its operation ("Response Listtools"): a name no
    client should take for a type."""
    for content in response.get("content", {}).values():
        schema = content.get("schema", {})
        if str(schema.get("title", "")).startswith("Response "):
            del schema["title"]


def _rewrite(document: dict[str, Any]) -> dict[str, Any]:
    _add_schemas(document, event_schemas())
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            for status, response in operation.get("responses", {}).items():
                _drop_made_up_titles(response)
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
                tags=app.openapi_tags,
            )
            app.openapi_schema = _rewrite(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
