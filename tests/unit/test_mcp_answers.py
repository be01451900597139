"""The MCP server's pure parts: the idempotency key of a call, the runyard:// addresses, the
input schema a tool is listed with, and what a run answers."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from api.mcp.answers import (
    MAX_ARTIFACT_LINKS,
    RUN_JSON,
    artifact_uri,
    parse_uri,
    run_answer,
    run_uri,
)
from api.mcp.idempotency import BadIdempotencyKey, call_idempotency_key
from api.mcp.providers import PERMISSIVE_SCHEMA, mcp_input_schema
from api.schemas import RUN_EXAMPLE
from runyard.artifact_store import ArtifactFile
from runyard.domain.states import RunStatus
from runyard.reads.run_view import RunView
from runyard.registry.tools import ToolSpec

RUN = uuid.UUID("00000000-0000-4000-8000-000000000001")


def _view(status: RunStatus, **fields: Any) -> RunView:
    """The API's example run, in ``status``, with ``fields`` changed."""
    plain = {"result": None, "exit_code": None, "finished_at": None}
    return RUN_JSON.validate_python(
        {**RUN_EXAMPLE, **plain, "id": str(RUN), "status": status.value, **fields}
    )


@pytest.mark.parametrize(
    ("meta", "session", "request_id", "expected"),
    [
        ({"io.runyard/idempotency_key": "k1"}, "s", 1, "k1"),
        ({"idempotency_key": "k2"}, None, None, "k2"),
        # The explicit key wins over the derived one.
        ({"io.runyard/idempotency_key": "k3"}, "s", 7, "k3"),
        # Stateless: request ids repeat across connections, so no key at all.
        ({}, None, 1, None),
        (None, "s", None, None),
    ],
)
def test_call_idempotency_key__explicit_else_derived_else_none(
    meta: Any, session: str | None, request_id: int | None, expected: str | None
):
    assert call_idempotency_key(meta, session, request_id) == expected


def test_call_idempotency_key__derived_from_session_and_request_id_alone():
    key = call_idempotency_key({}, "session-a", 7)
    assert key is not None and key.startswith("mcp-") and len(key) <= 255
    assert call_idempotency_key(None, "session-a", 7) == key
    assert call_idempotency_key({}, "session-b", 7) != key
    assert call_idempotency_key({}, "session-a", 8) != key
    # A string id is another request than the number of the same digits.
    assert call_idempotency_key({}, "session-a", "7") != key


@pytest.mark.parametrize("bad", ["", "has space", "x" * 256, 12, "tab\there", "é"])
def test_call_idempotency_key__an_unusable_explicit_key_is_refused(bad: Any):
    with pytest.raises(BadIdempotencyKey, match="printable ASCII"):
        call_idempotency_key({"io.runyard/idempotency_key": bad}, "s", 1)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (run_uri(RUN), (RUN, None)),
        (artifact_uri(RUN, "out/a b.txt"), (RUN, "out/a b.txt")),
        (f"runyard://runs/{RUN}/artifacts/", None),
        (f"runyard://runs/{RUN}/logs/x", None),
        ("runyard://runs/not-a-uuid", None),
        ("file:///etc/passwd", None),
    ],
)
def test_parse_uri__runs_and_their_artifacts_only(uri: str, expected: Any):
    assert parse_uri(uri) == expected


def _tool(schema: dict[str, Any] | None) -> ToolSpec:
    return ToolSpec(name="t", image="i", command=["x"], input_schema=schema)


@pytest.mark.parametrize(
    ("schema", "listed"),
    [
        (None, PERMISSIVE_SCHEMA),
        ({"type": "object", "required": ["a"]}, {"type": "object", "required": ["a"]}),
        # MCP arguments are always an object: a tool that takes anything else is not listed.
        ({"type": "string"}, None),
        ({"enum": [1, 2]}, None),
    ],
)
def test_mcp_input_schema__the_tools_own_or_any_object(schema: Any, listed: Any):
    assert mcp_input_schema(_tool(schema)) == listed


def test_run_answer__a_json_result_is_structured_content_and_text():
    answer = run_answer(_view(RunStatus.SUCCEEDED, result={"n": 1}))
    assert answer.is_error is False
    assert answer.structured_content == {"n": 1}
    assert answer.content[0].text == '{"n": 1}'  # type: ignore[union-attr]
    assert answer.meta == {"io.runyard/run_id": str(RUN), "io.runyard/status": "succeeded"}


def test_run_answer__a_result_that_is_not_an_object_is_wrapped():
    answer = run_answer(_view(RunStatus.SUCCEEDED, result=[1, 2]))
    assert answer.structured_content == {"result": [1, 2]}


def test_run_answer__without_a_result_the_output_is_the_text():
    answer = run_answer(_view(RunStatus.SUCCEEDED), stdout="hello\n")
    assert answer.structured_content is None
    assert answer.content[0].text == "hello\n"  # type: ignore[union-attr]


def test_run_answer__a_run_that_ended_otherwise_is_an_error_with_its_id():
    answer = run_answer(
        _view(RunStatus.TIMED_OUT, error_code="idle_timeout", error="silent for 6 s")
    )
    assert answer.is_error is True
    assert answer.content[0].text == (  # type: ignore[union-attr]
        f"run {RUN} timed_out (idle_timeout): silent for 6 s"
    )
    assert answer.structured_content["run_id"] == str(RUN)


def test_run_answer__a_run_still_going_says_how_to_fetch_it():
    answer = run_answer(_view(RunStatus.QUEUED), waited_seconds=60)
    assert answer.is_error is False
    text = answer.content[0].text  # type: ignore[union-attr]
    assert f"run {RUN} is still queued after waiting 60 s" in text
    assert "runyard_get_run" in text and run_uri(RUN) in text


def test_run_answer__artifacts_are_resource_links_up_to_a_cap():
    files = [ArtifactFile(f"f{i}.txt", i, "0" * 64) for i in range(MAX_ARTIFACT_LINKS + 2)]
    answer = run_answer(_view(RunStatus.SUCCEEDED, result={}), artifacts=files)
    links = [block for block in answer.content if block.type == "resource_link"]
    assert len(links) == MAX_ARTIFACT_LINKS
    assert links[1].uri == artifact_uri(RUN, "f1.txt") and links[1].mime_type == "text/plain"
    assert answer.content[-1].text.startswith("2 more artifacts")  # type: ignore[union-attr]
