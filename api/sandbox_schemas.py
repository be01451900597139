"""Request and response models of the sandbox routes (``api/routes/sandboxes.py``)."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import RunLimits
from runyard.domain.sandboxes import MAX_EXECS_CEILING, EndReason
from runyard.registry.tools import TOOL_NAME_PATTERN, bounds_schema, within_bounds

# The most a command's stdin may carry (it is stored with the command).
MAX_STDIN_BYTES = 1_048_576


class SandboxCreate(BaseModel):
    """A request for a sandbox of a tool that allows them; unknown fields are refused."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"tool": "shell", "ttl_seconds": 600, "idle_timeout_seconds": 120},
                {"tool": "shell", "limits": {"memory_mb": 256}, "env": {"LANG": "C.UTF-8"}},
            ]
        },
    )

    tool: str = Field(
        min_length=1,
        max_length=63,
        pattern=TOOL_NAME_PATTERN,
        description="A registered tool whose definition has sandbox = true",
    )
    ttl_seconds: Annotated[int, within_bounds("timeout_seconds")] | None = Field(
        default=None,
        description="Seconds the sandbox may live from its start, up to the tool's maximum "
        "timeout (its default)",
        json_schema_extra=bounds_schema("timeout_seconds"),
    )
    idle_timeout_seconds: Annotated[int, within_bounds("idle_timeout_seconds")] | None = Field(
        default=None,
        description="Seconds without an exec or a file access after which it ends (300)",
        json_schema_extra=bounds_schema("idle_timeout_seconds"),
    )
    max_execs: int | None = Field(
        default=None, ge=1, le=MAX_EXECS_CEILING, description="Commands that may run at once (4)"
    )
    limits: RunLimits | None = Field(
        default=None,
        description="memory_mb and cpus up to the tool's maxima; timeout_seconds is the TTL",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment of the container and its commands"
    )


class SandboxOut(BaseModel):
    """A sandbox as its caller sees it."""

    id: uuid.UUID
    tool: str
    status: Literal["starting", "running", "ended"]
    end_reason: EndReason | None = Field(description="Why it ended; null while it lives")
    error: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    expires_at: datetime | None = Field(description="Its TTL as a time, once it started")
    idle_timeout_seconds: int
    last_active_at: datetime
    max_execs: int


class SandboxPage(BaseModel):
    """The caller's newest sandboxes."""

    sandboxes: list[SandboxOut]


class ExecCreate(BaseModel):
    """A command to run in a sandbox; unknown fields are refused."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"command": ["sh", "-c", "echo hello"]},
                {"command": ["wc", "-c"], "stdin": "some text", "cwd": "src", "env": {"A": "1"}},
            ]
        },
    )

    command: list[str] = Field(min_length=1, description="The program and its arguments")
    stdin: str = Field(default="", description="Text the command reads on its standard input")
    stdin_base64: str | None = Field(
        default=None, description="Bytes for its standard input, base64 (instead of stdin)"
    )
    env: dict[str, str] = Field(default_factory=dict, description="More environment")
    cwd: str | None = Field(
        default=None, max_length=4096, description="Directory relative to the workspace"
    )
    timeout_seconds: int = Field(default=60, ge=1, le=86_400, description="Killed after this")

    def stdin_bytes(self) -> bytes | None:
        """The standard input as bytes; None if ``stdin_base64`` is not base64."""
        if self.stdin_base64 is None:
            return self.stdin.encode()
        try:
            return base64.b64decode(self.stdin_base64, validate=True)
        except ValueError:
            return None


class ExecOut(BaseModel):
    """A command in a sandbox, with its output so far (secrets masked)."""

    id: uuid.UUID
    sandbox_id: uuid.UUID
    command: list[str]
    cwd: str
    status: Literal["pending", "running", "finished"]
    exit_code: int | None
    timed_out: bool
    error: str | None
    stdout: str
    stderr: str
    truncated: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class FileOut(BaseModel):
    """A file written into a sandbox's workspace."""

    path: str = Field(description="Relative to the workspace")
    size: int
