"""Turning a caller's request into a ``NewRun`` (tool lookup, input validation, snapshot)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema

from runyard.queue import NewRun
from runyard.tools import ToolRegistry


class UnknownTool(Exception):
    """No tool of that name is registered."""


class InvalidInput(Exception):
    """The input does not match the tool's input schema."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class RunRequest:
    """What a caller asks for, parsed (types and bounds) but not yet checked against the
    tool registry."""

    tenant: str
    tool: str
    input: Any
    priority: int = 0
    idempotency_key: str | None = None
    callback_url: str | None = None

    def prepare(self, registry: ToolRegistry) -> NewRun:
        """Resolve the tool, check the input against its schema, snapshot its definition."""
        tool = registry.get(self.tool)
        if tool is None:
            raise UnknownTool(f"no tool named {self.tool!r}; GET /v1/tools lists them")
        if tool.input_schema is not None:
            validator = jsonschema.Draft202012Validator(tool.input_schema)
            error = jsonschema.exceptions.best_match(validator.iter_errors(self.input))
            if error is not None:
                path = ".".join(str(part) for part in ("input", *error.absolute_path))
                raise InvalidInput(f"{path}: {error.message}", path)
        return NewRun(
            tenant=self.tenant,
            tool=tool.name,
            spec=tool.snapshot(),
            input=self.input,
            max_attempts=tool.max_attempts,
            timeout_seconds=tool.timeout_seconds,
            priority=self.priority,
            idempotency_key=self.idempotency_key,
            callback_url=self.callback_url,
        )


def prepare_run(
    registry: ToolRegistry,
    *,
    tenant: str,
    tool_name: str,
    input_value: Any,
    priority: int = 0,
    callback_url: str | None = None,
) -> NewRun:
    """``RunRequest.prepare`` for callers outside the API (tests, benchmarks)."""
    request = RunRequest(tenant, tool_name, input_value, priority, callback_url=callback_url)
    return request.prepare(registry)
