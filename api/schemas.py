"""Request and response models, separate from the ORM rows; requests forbid unknown fields."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runyard.models import RunStatus, ToolRun


class RunCreate(BaseModel):
    """A request to run a registered tool with some input."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"tool": "echo", "input": {"message": "hello"}}]},
    )

    tool: str = Field(min_length=1, max_length=63, description="Name of a registered tool")
    input: Any = Field(default_factory=dict, description="JSON input, checked against the tool")
    priority: int = Field(default=0, ge=-100, le=100)


class RunOut(BaseModel):
    """A run as the API shows it: no lease tokens, container ids or streams."""

    id: uuid.UUID
    tool: str
    status: RunStatus
    mode: str
    input: Any
    result: Any | None
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

    @classmethod
    def from_row(cls, run: ToolRun) -> RunOut:
        """Project an ORM row onto the public shape."""
        return cls(
            id=run.id,
            tool=run.tool,
            status=run.status,
            mode=run.mode,
            input=run.input,
            result=run.result,
            exit_code=run.exit_code,
            attempts=run.attempts,
            max_attempts=run.max_attempts,
            error_code=run.error_code,
            error=run.error,
            stdout_truncated=run.stdout_truncated,
            stderr_truncated=run.stderr_truncated,
            requested_at=run.requested_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
        )


class RunPage(BaseModel):
    """One page of runs, newest first, with the cursor of the next page."""

    items: list[RunOut]
    next_cursor: str | None


class ToolOut(BaseModel):
    """A registered tool and its limits."""

    name: str
    description: str
    image: str
    timeout_seconds: int
    memory_mb: int
    cpus: float
    pids_limit: int
    max_attempts: int
    input_schema: dict[str, Any] | None
