"""The OpenAPI document is fit for generated clients: verb-like operation ids, a tag on every
operation, a schema for every event the event routes send, an example on every request body."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any, get_args

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from api.actions.events import format_event, ndjson_event
from api.event_schemas import BuildEventType
from api.main import create_app
from api.openapi import OPENAPI_TAGS, _add_schemas
from runyard.domain.run_events import RUN_EVENT_TYPES
from runyard.platform.models import ToolRunEvent
from runyard.platform.settings import Settings

OPERATION_ID = re.compile(r"^[a-z]+[A-Za-z]*$")
# The first word of every operation id: what the operation does.
VERBS = {
    "build",
    "cancel",
    "check",
    "create",
    "delete",
    "download",
    "get",
    "list",
    "pause",
    "rerun",
    "resume",
    "retry",
    "revoke",
    "set",
    "submit",
    "update",
    "upload",
}
METHODS = {"get", "put", "post", "delete", "patch"}
AT = "2026-11-26T10:00:00.120000+00:00"

# One event of each type, its data as the database's statements write it.
RUN_EVENT_SAMPLES: dict[str, dict[str, Any]] = {
    "status": {"status": "failed", "attempt": 2, "exit_code": 3, "error_code": "tool_failed"},
    "claimed": {"attempt": 1, "worker_id": "worker-7f3a", "engine_id": None},
    "adopted": {"attempt": 1, "worker_id": "worker-9c1d"},
    "released": {"attempt": 1, "reason": "engine_trouble", "adoptable_at": AT},
    "requeued": {"attempt": 1, "available_at": AT, "error_code": "container_lost"},
    "lease_expired": {"attempt": 1},
    "cancel_requested": {},
    "stdout": {"attempt": 1, "text": "sleeping 2\n", "until": "2026-11-26T10:00:00.1234567Z"},
    "stderr": {"attempt": 1, "text": "about to fail\n", "until": "2026-11-26T10:00:01Z"},
    "waiting": {"dependencies": 2, "run_at": AT},
    "dependencies_met": {},
    "webhook": {
        "delivery_id": "6a1c2f4e-8d3b-4f7a-9e21-5b0c3d4e5f60",
        "attempt": 1,
        "outcome": "retrying",
        "status_code": 503,
        "next_attempt_at": AT,
    },
    "stale": {"attempt": 1, "quiet_seconds": 300},
    "egress": {
        "host": "api.example.org",
        "port": 443,
        "address": "93.184.216.34",
        "allowed": True,
        "reason": None,
        "bytes_out": 517,
        "bytes_in": 4312,
        "seconds": 0.25,
    },
}
BUILD_EVENT_SAMPLES: dict[str, dict[str, Any]] = {
    "log": {"text": "Step 1/4 : FROM runyard/toolbox:latest\n", "gap": False},
    "status": {"status": "building"},
}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    """The app's document (built without its lifespan: nothing connects)."""
    app = create_app(Settings(database_url="postgresql://unused@127.0.0.1:9/unused"))
    return app.openapi()


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def validator(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """Validates against ``schema``, its ``#/components/...`` references resolved."""
    return Draft202012Validator(
        {**schema, "components": document["components"]}, format_checker=FormatChecker()
    )


def content_of(document: dict[str, Any], path: str, media_type: str) -> dict[str, Any]:
    content: dict[str, dict[str, Any]] = document["paths"][path]["get"]["responses"]["200"][
        "content"
    ]
    return content[media_type]


def sse_messages(item_schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The SSE item's message schemas, by their ``event``."""
    return {message["properties"]["event"]["const"]: message for message in item_schema["oneOf"]}


def test_operation_ids__are_lower_camel_case_verbs_and_unique(document: dict[str, Any]):
    ids = [operation["operationId"] for _, _, operation in operations(document)]
    assert len(ids) == 46
    assert len(set(ids)) == len(ids), ids
    for method, path, operation in operations(document):
        operation_id = operation["operationId"]
        # FastAPI's default, e.g. submit_run_v1_runs_post, has the path and method in it.
        assert OPERATION_ID.fullmatch(operation_id), (method, path, operation_id)
        assert not operation_id.lower().endswith(method), (path, operation_id)
        verb = re.match(r"[a-z]+", operation_id)
        assert verb is not None and verb[0] in VERBS, (path, operation_id)


def test_operation_ids__name_the_routes_as_documented(document: dict[str, Any]):
    by_route = {(m, p): op["operationId"] for m, p, op in operations(document)}
    assert by_route[("post", "/v1/runs")] == "submitRun"
    assert by_route[("get", "/v1/runs/{run_id}")] == "getRun"
    assert by_route[("get", "/v1/runs/{run_id}/events")] == "getRunEvents"
    assert by_route[("post", "/v1/batches")] == "submitBatch"
    assert by_route[("get", "/v1/usage")] == "getUsage"
    assert by_route[("get", "/v1/runs/{run_id}/artifacts/{path}")] == "downloadArtifact"


def test_operations__each_has_one_declared_tag(document: dict[str, Any]):
    declared = [tag["name"] for tag in document["tags"]]
    assert declared == [tag["name"] for tag in OPENAPI_TAGS]
    used = set()
    for method, path, operation in operations(document):
        tags = operation.get("tags", [])
        assert len(tags) == 1 and tags[0] in declared, (method, path, tags)
        used.add(tags[0])
    assert used == set(declared)
    assert all(tag["description"] for tag in document["tags"])


def test_inline_answers__carry_no_made_up_title(document: dict[str, Any]):
    listed = content_of(document, "/v1/tools", "application/json")["schema"]
    assert listed["items"] == {"$ref": "#/components/schemas/ToolOut"}
    assert "title" not in listed


def test_run_events__every_type_written_has_a_schema(document: dict[str, Any]):
    schemas = document["components"]["schemas"]
    mapping = schemas["RunEvent"]["discriminator"]["mapping"]
    assert set(mapping) == RUN_EVENT_TYPES
    for kind, ref in mapping.items():
        member = schemas[ref.rsplit("/", 1)[-1]]
        assert member["properties"]["type"]["const"] == kind
        assert member["properties"]["data"]["$ref"].rsplit("/", 1)[-1] in schemas
    ndjson = content_of(document, "/v1/runs/{run_id}/events", "application/x-ndjson")
    assert ndjson["itemSchema"] == {"$ref": "#/components/schemas/RunEvent"}
    sse = content_of(document, "/v1/runs/{run_id}/events", "text/event-stream")
    assert set(sse_messages(sse["itemSchema"])) == RUN_EVENT_TYPES


def test_build_events__every_type_sent_has_a_schema(document: dict[str, Any]):
    sse = content_of(document, "/v1/builds/{build_id}/events", "text/event-stream")
    messages = sse_messages(sse["itemSchema"])
    assert set(messages) == set(get_args(BuildEventType))
    for message in messages.values():
        ref = message["properties"]["data"]["contentSchema"]["$ref"]
        assert ref.rsplit("/", 1)[-1] in document["components"]["schemas"]


@pytest.mark.parametrize("kind", sorted(RUN_EVENT_SAMPLES))
def test_run_event_schemas__fit_what_the_routes_write(document: dict[str, Any], kind: str):
    event = ToolRunEvent(
        id=41, at=datetime(2026, 11, 26, 10, tzinfo=UTC), type=kind, data=RUN_EVENT_SAMPLES[kind]
    )
    line = json.loads(ndjson_event(event))
    validator(document, {"$ref": "#/components/schemas/RunEvent"}).validate(line)
    data_ref = document["components"]["schemas"]["RunEvent"]["discriminator"]["mapping"][kind]
    member = document["components"]["schemas"][data_ref.rsplit("/", 1)[-1]]
    data_schema = document["components"]["schemas"][
        member["properties"]["data"]["$ref"].rsplit("/", 1)[-1]
    ]
    assert set(line["data"]) <= set(data_schema["properties"]), "an undocumented field"

    fields = {}
    for row in format_event(event).strip().split("\n"):
        name, value = row.split(": ", 1)
        fields[name] = value
    sse = content_of(document, "/v1/runs/{run_id}/events", "text/event-stream")
    message = sse_messages(sse["itemSchema"])[fields["event"]]
    validator(document, message).validate(fields)
    content_schema = message["properties"]["data"]["contentSchema"]
    validator(document, content_schema).validate(json.loads(fields["data"]))


def test_run_event_samples__cover_every_type():
    assert set(RUN_EVENT_SAMPLES) == RUN_EVENT_TYPES


@pytest.mark.parametrize("kind", sorted(BUILD_EVENT_SAMPLES))
def test_build_event_schemas__fit_the_samples(document: dict[str, Any], kind: str):
    sse = content_of(document, "/v1/builds/{build_id}/events", "text/event-stream")
    message = sse_messages(sse["itemSchema"])[kind]
    validator(document, message).validate(
        {"id": "39", "event": kind, "data": json.dumps(BUILD_EVENT_SAMPLES[kind])}
    )
    validator(document, message["properties"]["data"]["contentSchema"]).validate(
        BUILD_EVENT_SAMPLES[kind]
    )


def test_request_bodies__each_has_an_example_valid_against_its_schema(document: dict[str, Any]):
    bodies = 0
    for method, path, operation in operations(document):
        if "requestBody" not in operation:
            continue
        bodies += 1
        content = operation["requestBody"]["content"]
        if "application/json" not in content:
            # A raw upload (a sandbox's file): any bytes, shown by an example of its own.
            assert [*content] == ["application/octet-stream"], (method, path)
            assert "example" in content["application/octet-stream"], (method, path)
            continue
        media = content["application/json"]
        schema = media["schema"]
        resolved = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        examples = [
            *resolved.get("examples", []),
            *([media["example"]] if "example" in media else []),
            *(example["value"] for example in media.get("examples", {}).values()),
        ]
        assert examples, f"{method} {path} has no example"
        for example in examples:
            errors = [e.message for e in validator(document, schema).iter_errors(example)]
            assert errors == [], (method, path, example)
    assert bodies == 9


def test_added_schemas__never_replace_a_route_schema_of_the_same_name():
    document: dict[str, Any] = {"components": {"schemas": {"RunOut": {"type": "object"}}}}
    _add_schemas(document, {"RunOut": {"type": "object"}, "RunEvent": {"oneOf": []}})
    assert set(document["components"]["schemas"]) == {"RunOut", "RunEvent"}
    with pytest.raises(RuntimeError, match="RunOut"):
        _add_schemas(document, {"RunOut": {"type": "string"}})
