"""What an MCP tool call answers: a run as a ``CallToolResult`` (its result, its error, or
how to fetch it later), a refusal as a tool error, and the ``runyard://`` addresses of runs and
their artifacts."""

from __future__ import annotations

import json
import mimetypes
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote

import mcp.types as types
from pydantic import TypeAdapter

from api.problems import Problem
from runyard.artifact_store import ArtifactFile
from runyard.reads.run_view import RunView

RUN_SCHEME = "runyard"
RUN_URI_TEMPLATE = "runyard://runs/{run_id}"
ARTIFACT_URI_TEMPLATE = "runyard://runs/{run_id}/artifacts/{path}"
# The ``_meta`` entries every run answer carries, so a client finds the run without parsing.
RUN_ID_META = "io.runyard/run_id"
STATUS_META = "io.runyard/status"
# A run with more artifacts than this lists the first ones and says how many there are.
MAX_ARTIFACT_LINKS = 100
GET_RUN_TOOL = "runyard_get_run"

RUN_JSON = TypeAdapter(RunView)


def run_uri(run_id: uuid.UUID) -> str:
    """The resource address of a run."""
    return f"runyard://runs/{run_id}"


def artifact_uri(run_id: uuid.UUID, path: str) -> str:
    """The resource address of one of a run's artifacts (its path percent-encoded)."""
    return f"{run_uri(run_id)}/artifacts/{quote(path, safe='/')}"


def parse_uri(uri: str) -> tuple[uuid.UUID, str | None] | None:
    """``(run id, artifact path or None)`` of a ``runyard://runs/…`` address; None if it is
    not one."""
    prefix = "runyard://runs/"
    if not uri.startswith(prefix):
        return None
    run_part, _, rest = uri[len(prefix) :].partition("/")
    try:
        run_id = uuid.UUID(run_part)
    except ValueError:
        return None
    if not rest:
        return run_id, None
    kind, _, path = rest.partition("/")
    if kind != "artifacts" or not path:
        return None
    return run_id, unquote(path)


def run_document(view: RunView) -> dict[str, Any]:
    """The run as ``GET /v1/runs/{id}`` shows it."""
    document: dict[str, Any] = RUN_JSON.dump_python(view, mode="json")
    return document


def _meta(view: RunView) -> dict[str, Any]:
    return {RUN_ID_META: str(view.id), STATUS_META: view.status.value}


def fetch_hint(run_id: uuid.UUID) -> str:
    """How to get a run that is still going."""
    return (
        f'call the {GET_RUN_TOOL} tool with {{"run_id": "{run_id}"}} (it waits for the run '
        f"to end), or read the resource {run_uri(run_id)}"
    )


def run_answer(
    view: RunView,
    *,
    stdout: str | None = None,
    artifacts: Sequence[ArtifactFile] = (),
    waited_seconds: float | None = None,
) -> types.CallToolResult:
    """A run as a tool's answer: its result once it succeeded, a tool error with its error
    and id once it ended otherwise, and how to fetch it while it is still going."""
    if not view.status.is_terminal:
        waited = "" if waited_seconds is None else f" after waiting {waited_seconds:g} s"
        text = f"run {view.id} is still {view.status.value}{waited}; {fetch_hint(view.id)}"
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content={"run_id": str(view.id), "status": view.status.value},
            meta=_meta(view),
        )
    links = _artifact_links(view.id, artifacts)
    if view.status.value != "succeeded":
        text = f"run {view.id} {view.status.value}"
        if view.error_code:
            text += f" ({view.error_code})"
        if view.error:
            text += f": {view.error}"
        return types.CallToolResult(
            content=[types.TextContent(text=text), *links],
            structured_content={
                "run_id": str(view.id),
                "status": view.status.value,
                "error_code": view.error_code,
                "error": view.error,
                "exit_code": view.exit_code,
            },
            is_error=True,
            meta=_meta(view),
        )
    structured: dict[str, Any] | None = None
    if view.result is not None:
        text = json.dumps(view.result, ensure_ascii=False)
        # Structured content is a JSON object; any other JSON value is wrapped in one.
        structured = view.result if isinstance(view.result, dict) else {"result": view.result}
    else:
        text = stdout or f"run {view.id} succeeded without a result or output"
    return types.CallToolResult(
        content=[types.TextContent(text=text), *links],
        structured_content=structured,
        meta=_meta(view),
    )


def _artifact_links(run_id: uuid.UUID, artifacts: Sequence[ArtifactFile]) -> list[Any]:
    links: list[Any] = [
        types.ResourceLink(
            uri=artifact_uri(run_id, file.path),
            name=file.path,
            size=file.size,
            mime_type=mimetypes.guess_type(file.path)[0] or "application/octet-stream",
        )
        for file in artifacts[:MAX_ARTIFACT_LINKS]
    ]
    if len(artifacts) > MAX_ARTIFACT_LINKS:
        links.append(
            types.TextContent(
                text=f"{len(artifacts) - MAX_ARTIFACT_LINKS} more artifacts: "
                f"GET /v1/runs/{run_id}/artifacts lists them all"
            )
        )
    return links


def problem_answer(problem: Problem) -> types.CallToolResult:
    """A refused call as a tool error: its code, its message and the field at fault."""
    structured: dict[str, Any] = {"code": problem.code, "detail": problem.detail, **problem.extra}
    if "Retry-After" in problem.headers:
        structured["retry_after_seconds"] = int(problem.headers["Retry-After"])
    return types.CallToolResult(
        content=[types.TextContent(text=f"{problem.code}: {problem.detail}")],
        structured_content=structured,
        is_error=True,
    )
