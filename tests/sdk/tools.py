"""The scenario tools as Python functions: the in-memory fake runs them, and against the live
API the worker's fake runner does (``live_handler``), so both backends run the same code."""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime
from typing import Any

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.runner import AttemptControl
from runyard_client.testing import FakeTool, ToolContext, run_tool

# An artifact of a few network reads, the same bytes every time.
BINARY = random.Random(7).randbytes(300_000)
BINARY_SHA256 = hashlib.sha256(BINARY).hexdigest()


def echo(value: Any) -> Any:
    return value


def fail(value: Any) -> Any:
    raise RuntimeError(f"refused {value.get('what', 'this')}")


def chatty(value: Any, context: ToolContext) -> dict[str, int]:
    lines = int(value.get("lines", 3))
    for n in range(lines):
        context.print(f"line {n}")
    context.print("warning: chatty", stream="stderr")
    return {"lines": lines}


def files(value: Any, context: ToolContext) -> dict[str, bool]:
    context.artifact("report.txt", "all good\n")
    context.artifact("data/blob.bin", BINARY)
    return {"kept": True}


TOOLS: dict[str, FakeTool] = {"echo": echo, "fail": fail, "chatty": chatty, "files": files}


def live_handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
    """The fake runner's handler: run the tool's function, then write its log chunks and
    artifacts where a container's would go."""
    outcome = run_tool(TOOLS[spec.tool["name"]], spec.input, spec.run_id, spec.attempt)
    assert control.logs is not None and control.artifacts is not None
    for stream, text in outcome.output:
        until = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
        control.logs.write(stream, text, until)
    artifact_set = None
    if outcome.files:
        writer = control.artifacts.writer(spec.run_id)
        for path, data in outcome.files.items():
            writer.add(path, [data])
        writer.done()
        artifact_set = writer.set_id
    return AttemptResult(
        RunStatus.SUCCEEDED if outcome.succeeded else RunStatus.FAILED,
        exit_code=outcome.exit_code,
        result=outcome.result,
        stdout=outcome.text("stdout"),
        stderr=outcome.text("stderr"),
        error_code=outcome.error_code,
        error=outcome.error,
        artifact_set=artifact_set,
    )
