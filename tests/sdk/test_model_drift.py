"""The SDK's models match the API's component schemas (the app's own ``/openapi.json``, built
in-process): the same fields, required where the API always sends them, nullable where it may
send null, and of the same kind of JSON value, in the same order (so a model dumped gives the
document the API sent: the CLI prints them so). ``submit`` offers exactly the fields of
``POST /v1/runs``. Each run event class matches its type's schema (``RunEvent``'s member, its
``data`` read flat as the SDK reads it), and every type the API documents has a class."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from pydantic import BaseModel

from api.main import create_app
from runyard.platform.settings import Settings
from runyard_client import Runyard, events, models

# SDK model -> the API's component; (response: the SDK may be more lenient than the API).
RESPONSES: list[tuple[type[BaseModel], str]] = [
    (models.Run, "RunOut"),
    (models.RunPage, "RunPage"),
    (models.Tool, "ToolOut"),
    (models.ToolBuild, "ToolBuildOut"),
    (models.Artifact, "ArtifactOut"),
    (models.ArtifactList, "ArtifactList"),
    (models.Batch, "BatchCreated"),
    (models.Batch, "BatchOut"),
    (models.BatchRun, "BatchRunOut"),
    (models.BatchSummary, "BatchListed"),
    (models.BatchPage, "BatchPage"),
    (models.Problem, "ProblemOut"),
    (models.FieldProblem, "FieldError"),
    (models.Build, "BuildOut"),
    (models.BuildRequested, "BuildRequested"),
    (models.TenantWebhook, "WebhookSettingsOut"),
    (models.Schedule, "ScheduleOut"),
    (models.SchedulePage, "SchedulePage"),
    (models.UsageReport, "UsageReportOut"),
    (models.UsageLine, "UsageLineOut"),
]
REQUESTS: list[tuple[type[BaseModel], str]] = [
    (models.Limits, "RunLimits"),
    (models.BatchItem, "BatchItemIn"),
]
# Fields the API always sends that the SDK does not insist on, and why.
LENIENT = {
    ("Batch", "BatchOut"): {"runs"},  # a batch is also built from a submit's answer
    ("Batch", "BatchCreated"): {"runs", "run_ids"},  # and from GET, which has no run_ids
}
# Fields of the SDK model that a component lacks, because it maps to two components.
EXTRA = {("Batch", "BatchOut"): {"run_ids"}}


@pytest.fixture(scope="module")
def components() -> dict[str, Any]:
    app = create_app(Settings(database_url="postgresql://sdk@127.0.0.1/unused"))
    schemas: dict[str, Any] = app.openapi()["components"]["schemas"]
    return schemas


def kind(schema: dict[str, Any], components: dict[str, Any]) -> tuple[str, bool]:
    """A schema's coarse JSON kind (string, integer, number, boolean, array[...], object,
    any) and whether null is allowed."""
    if "$ref" in schema:
        return kind(components[schema["$ref"].rsplit("/", 1)[-1]], components)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            kinds = [kind(option, components) for option in schema[key]]
            nullable = any(k == "null" or n for k, n in kinds)
            concrete = sorted({k for k, _ in kinds if k != "null"})
            return (concrete[0] if len(concrete) == 1 else "any"), nullable
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return kind(schema["allOf"][0], components)
    if "enum" in schema and "type" not in schema:
        return "string", None in schema["enum"]
    value = schema.get("type")
    if value is None:
        return ("object", False) if "properties" in schema else ("any", True)
    if value == "array":
        items = kind(schema.get("items", {}), components)[0]
        return f"array[{items}]", False
    return str(value), value == "null"


def fields(schema: dict[str, Any]) -> tuple[set[str], set[str]]:
    return set(schema.get("properties", {})), set(schema.get("required", []))


def sdk_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")


def resolved(model: type[BaseModel]) -> dict[str, Any]:
    """The SDK model's schema with its own definitions to resolve references in."""
    schema = sdk_schema(model)
    return {**schema.get("$defs", {}), model.__name__: schema}


def drift(model: type[BaseModel], component: str, api: dict[str, Any]) -> list[str]:
    """Every difference between the SDK model and the API's component."""
    ours = resolved(model)
    mine = ours[model.__name__]
    names, required = fields(mine)
    api_names, api_required = fields(api[component])
    pair = (model.__name__, component)
    problems = [f"the API has {name}, the SDK not" for name in sorted(api_names - names)]
    extra = names - api_names - EXTRA.get(pair, set())
    problems += [f"the SDK has {name}, the API not" for name in sorted(extra)]
    problems += [f"the SDK requires {name}" for name in sorted(required - api_required)]
    lenient = api_required - required - LENIENT.get(pair, set())
    problems += [f"the API always sends {name}, the SDK does not require it" for name in lenient]
    for name in sorted(names & api_names):
        theirs = kind(api[component]["properties"][name], api)
        mine_kind = kind(mine["properties"][name], ours)
        if theirs[0] != mine_kind[0] and "any" not in (theirs[0], mine_kind[0]):
            problems.append(f"{name}: the API sends {theirs[0]}, the SDK reads {mine_kind[0]}")
        if theirs[1] and not mine_kind[1]:
            problems.append(f"{name}: the API may send null, the SDK refuses it")
    return problems


@pytest.mark.parametrize(("model", "component"), RESPONSES + REQUESTS)
def test_model__matches_the_api_component(model, component, components):
    assert drift(model, component, components) == []


@pytest.mark.parametrize(("model", "component"), RESPONSES)
def test_model__has_the_api_components_fields_in_its_order(model, component, components):
    extra = EXTRA.get((model.__name__, component), set())
    ours = [name for name in sdk_schema(model)["properties"] if name not in extra]
    assert ours == list(components[component]["properties"])


def test_submit__offers_exactly_the_fields_of_a_run_submission(components):
    body, _ = fields(components["RunCreate"])
    offered = {
        name
        for name, p in inspect.signature(Runyard.submit).parameters.items()
        if name not in ("self", "idempotency_key")
    }
    assert offered == body


def test_drift__reports_a_renamed_a_retyped_and_a_newly_required_field():
    api = {
        "Thing": {
            "properties": {"id": {"type": "string"}, "count": {"type": "string"}},
            "required": ["id", "count"],
        }
    }

    class Thing(BaseModel):
        ident: str
        count: int

    assert drift(Thing, "Thing", api) == [
        "the API has id, the SDK not",
        "the SDK has ident, the API not",
        "the SDK requires ident",
        "the API always sends id, the SDK does not require it",
        "count: the API sends string, the SDK reads integer",
    ]


def event_component(components: dict[str, Any], kind: str) -> dict[str, Any]:
    """The API's event of type ``kind`` as the SDK reads it: ``id``, ``at`` and ``type``
    beside the fields of its ``data``. ``type`` is left out of ``required``: it is the
    discriminator, checked as a constant on its own (the SDK's default only helps build an
    event in code)."""
    mapping = components["RunEvent"]["discriminator"]["mapping"]
    member = components[mapping[kind].rsplit("/", 1)[-1]]
    data = components[member["properties"]["data"]["$ref"].rsplit("/", 1)[-1]]
    envelope = {name: value for name, value in member["properties"].items() if name != "data"}
    required = [name for name in member["required"] if name not in ("data", "type")]
    return {
        "properties": {**envelope, **data.get("properties", {})},
        "required": required + data.get("required", []),
    }


def documented_event_types(components: dict[str, Any]) -> set[str]:
    return set(components["RunEvent"]["discriminator"]["mapping"])


def test_events__every_type_the_api_documents_has_an_sdk_class(components):
    assert documented_event_types(components) == set(events.KNOWN_EVENTS)


@pytest.mark.parametrize("kind", sorted(events.KNOWN_EVENTS))
def test_event__matches_its_types_schema(kind: str, components):
    model = events.KNOWN_EVENTS[kind]
    name = f"RunEvent[{kind}]"
    flat = {**components, name: event_component(components, kind)}
    assert drift(model, name, flat) == []
    assert sdk_schema(model)["properties"]["type"]["const"] == kind
    assert flat[name]["properties"]["type"]["const"] == kind
    # An event with only what the API always sends reads as this class.
    read = events.event_of(1, kind, {"at": "2026-01-01T00:00:00Z", **sample(flat, name)})
    assert type(read) is model


def sample(components: dict[str, Any], name: str) -> dict[str, Any]:
    """A value for every required data field of a flattened event schema."""
    schema = components[name]
    found: dict[str, Any] = {}
    for field in set(schema["required"]) - {"id", "at"}:
        prop = schema["properties"][field]
        if "$ref" in prop:
            found[field] = components[prop["$ref"].rsplit("/", 1)[-1]]["enum"][-1]
        elif "enum" in prop:
            found[field] = prop["enum"][0]
        elif prop.get("format") == "date-time":
            found[field] = "2026-01-01T00:00:00Z"
        elif prop.get("format") == "uuid":
            found[field] = "00000000-0000-4000-8000-000000000000"
        else:
            found[field] = {"integer": 1, "number": 0.5, "string": "x", "boolean": True}[
                prop["type"]
            ]
    return found
