"""Running a Python callable as a fake tool: what it returns is the result, what it raises
fails the run with its message, what it prints and keeps are its logs and artifacts."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

FakeTool = Callable[..., Any]
Stream = Literal["stdout", "stderr"]


class ToolContext:
    """What a fake tool may use besides its input: print to its logs, keep artifacts."""

    def __init__(self, run_id: uuid.UUID, attempt: int = 1) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.output: list[tuple[Stream, str]] = []
        self.files: dict[str, bytes] = {}

    def print(self, *parts: object, stream: Stream = "stdout", end: str = "\n") -> None:
        """Write a line to the run's stdout (or stderr): one live log chunk."""
        self.output.append((stream, " ".join(str(part) for part in parts) + end))

    def artifact(self, path: str, data: bytes | str) -> None:
        """Keep a file as the run's artifact ``path`` (relative, ``/`` between folders)."""
        self.files[path] = data.encode() if isinstance(data, str) else bytes(data)


@dataclass
class ToolOutcome:
    """How one call of a fake tool ended."""

    succeeded: bool
    result: Any = None
    exit_code: int = 0
    error_code: str | None = None
    error: str | None = None
    output: list[tuple[Stream, str]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)

    def text(self, stream: Stream) -> str:
        """Everything written to ``stream``."""
        return "".join(text for kind, text in self.output if kind == stream)


def _takes_context(tool: FakeTool) -> bool:
    try:
        parameters = inspect.signature(tool).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def run_tool(tool: FakeTool, value: Any, run_id: uuid.UUID, attempt: int = 1) -> ToolOutcome:
    """Call ``tool(input)`` (or ``tool(input, context)`` if it takes two arguments): its
    return value, JSON as the API would store it, is the result; an exception fails the
    run (``tool_failed``, exit code 1) with the exception's message."""
    context = ToolContext(run_id, attempt)
    try:
        returned = tool(value, context) if _takes_context(tool) else tool(value)
    except Exception as exc:
        message = str(exc) or type(exc).__name__
        return ToolOutcome(False, None, 1, "tool_failed", message, context.output, context.files)
    try:
        result = json.loads(json.dumps(returned, allow_nan=False))
    except (TypeError, ValueError) as exc:
        error = f"the result is not JSON: {exc}"
        return ToolOutcome(False, None, 0, "invalid_result", error, context.output, context.files)
    return ToolOutcome(True, result, 0, None, None, context.output, context.files)
