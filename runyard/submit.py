"""Turning a caller's request into a ``NewRun`` (tool lookup, input validation, snapshot),
and the quick read of a run the submit answers with."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jsonschema
from sqlalchemy import Engine, text

from runyard.db import autocommit
from runyard.models import RunStatus
from runyard.queue import NewRun
from runyard.tools import ToolRegistry


class UnknownTool(Exception):
    """No tool of that name is registered."""


class InvalidInput(Exception):
    """The input does not match the tool's input schema."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def prepare_run(
    registry: ToolRegistry,
    *,
    tenant: str,
    tool_name: str,
    input_value: Any,
    priority: int = 0,
    idempotency_key: str | None = None,
    callback_url: str | None = None,
) -> NewRun:
    """Resolve the tool, check the input against its schema, snapshot its definition."""
    tool = registry.get(tool_name)
    if tool is None:
        raise UnknownTool(f"no tool named {tool_name!r}; GET /v1/tools lists them")
    if tool.input_schema is not None:
        validator = jsonschema.Draft202012Validator(tool.input_schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(input_value))
        if error is not None:
            path = ".".join(str(part) for part in ("input", *error.absolute_path))
            raise InvalidInput(f"{path}: {error.message}", path)
    return NewRun(
        tenant=tenant,
        tool=tool.name,
        spec=tool.snapshot(),
        input=input_value,
        max_attempts=tool.max_attempts,
        timeout_seconds=tool.timeout_seconds,
        priority=priority,
        idempotency_key=idempotency_key,
        callback_url=callback_url,
    )


# What the API shows of a run, read in one autocommit round trip (no ORM, no transaction);
# ``tenant`` NULL means any tenant (admins).
RUN_VIEW = text(
    """
    SELECT id, tool, status, mode, input, result, exit_code, attempts, max_attempts,
           error_code, error, stdout_truncated, stderr_truncated, requested_at, started_at,
           finished_at
    FROM tool_runs
    WHERE id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
    """
)


@dataclass(frozen=True)
class RunView:
    """The public fields of a run, as ``RUN_VIEW`` reads them."""

    id: uuid.UUID
    tool: str
    status: RunStatus
    mode: str
    input: Any
    result: Any
    exit_code: int | None
    attempts: int
    max_attempts: int
    error_code: str | None
    error: str | None
    stdout_truncated: bool
    stderr_truncated: bool
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


def read_run_view(engine: Engine, run_id: uuid.UUID, tenant: str | None) -> RunView | None:
    """The run's public fields if ``tenant`` may see it (None: any tenant), else None."""
    rows = autocommit(engine, RUN_VIEW, {"id": run_id, "tenant": tenant})
    if not rows:
        return None
    row = rows[0]._asdict()
    row["status"] = RunStatus(row["status"])
    return RunView(**row)
