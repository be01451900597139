"""Request and response models, separate from the ORM rows; requests forbid unknown fields."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from runyard.domain.flow_limits import CONCURRENCY_KEY_PATTERN
from runyard.domain.graph import MAX_DEPENDENCIES
from runyard.reads.run_view import RunView
from runyard.registry.tools import TOOL_NAME_PATTERN, bounds_schema, within_bounds
from runyard.submission.request import RunRequest
from runyard.tenancy.auth import MAX_KEY_TOOLS
from runyard.webhooks.urls import MAX_URL_LENGTH

RUN_EXAMPLE: dict[str, Any] = {
    "id": "0f8a3c52-5a7e-4d6b-9a53-2d1f8f5f9c11",
    "tool": "echo",
    "status": "succeeded",
    "mode": "queue",
    "input": {"message": "hello"},
    "result": {"message": "hello"},
    "exit_code": 0,
    "attempts": 1,
    "max_attempts": 1,
    "error_code": None,
    "error": None,
    "stdout_truncated": False,
    "stderr_truncated": False,
    "requested_at": "2026-11-26T10:00:00.000000Z",
    "started_at": "2026-11-26T10:00:00.120000Z",
    "finished_at": "2026-11-26T10:00:00.910000Z",
}


# A tool name in a key's list: it need not be registered yet (the registry can be reloaded).
ToolName = Annotated[str, StringConstraints(pattern=TOOL_NAME_PATTERN)]


class RunLimits(BaseModel):
    """Limits one run asks for instead of its tool's, each up to the tool's maximum and always
    within the platform's bounds (``runyard.domain.limit_bounds``: never 0 CPUs, never no limit)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    timeout_seconds: Annotated[int, within_bounds("timeout_seconds")] | None = Field(
        default=None,
        description="Wall-clock limit in seconds",
        json_schema_extra=bounds_schema("timeout_seconds"),
    )
    memory_mb: Annotated[int, within_bounds("memory_mb")] | None = Field(
        default=None,
        description="Memory limit in MB (no swap)",
        json_schema_extra=bounds_schema("memory_mb"),
    )
    cpus: Annotated[float, within_bounds("cpus")] | None = Field(
        default=None,
        description="CPU limit (0.01 at least: the engine's smallest share)",
        json_schema_extra=bounds_schema("cpus"),
    )


class RunCreate(BaseModel):
    """A request to run a registered tool with some input; unknown fields are refused."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"tool": "echo", "input": {"message": "hello"}},
                {"tool": "sleep", "input": {"seconds": 2}, "priority": 10},
            ]
        },
    )

    tool: str = Field(
        min_length=1,
        max_length=63,
        pattern=TOOL_NAME_PATTERN,
        description="Name of a registered tool (GET /v1/tools)",
    )
    input: Any = Field(
        default_factory=dict, description="JSON input, checked against the tool's input_schema"
    )
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description="Higher runs first; queue mode only; at most the key's max_priority",
    )
    limits: RunLimits | None = Field(
        default=None, description="Per-run limits, up to the tool's max_* values (GET /v1/tools)"
    )
    callback_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="http(s) URL that gets the run, signed, when it ends (else the tenant's "
        "default webhook, if any); it must resolve to public addresses",
    )

    depends_on: list[Annotated[uuid.UUID, Field(strict=False)]] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="Runs of yours this one waits for: it starts once all have succeeded, "
        "and fails with dependency_failed if one ends otherwise (queue mode)",
    )
    run_at: AwareDatetime | None = Field(
        default=None,
        strict=False,
        description="RFC 3339 time before which the run does not start, at most 30 days "
        "ahead; a past time means now (queue mode)",
    )

    concurrency_key: str | None = Field(
        default=None,
        pattern=CONCURRENCY_KEY_PATTERN,
        description="A key of yours (e.g. a customer id): the tool's per-key flow limits "
        "apply to the runs of each key (queue mode)",
    )

    def request(
        self,
        tenant: str,
        idempotency_key: str | None,
        max_priority: int | None = None,
        allowed_tools: frozenset[str] | None = None,
    ) -> RunRequest:
        """The core's request for ``tenant``, whose key allows at most ``max_priority`` and
        the tools ``allowed_tools`` (None: every tool)."""
        limits = self.limits.model_dump(exclude_none=True) if self.limits else {}
        return RunRequest(
            tenant,
            self.tool,
            self.input,
            self.priority,
            idempotency_key,
            self.callback_url,
            max_priority=max_priority,
            allowed_tools=allowed_tools,
            limits=limits,
            depends_on=tuple(str(dep) for dep in dict.fromkeys(self.depends_on)),
            run_at=self.run_at,
            concurrency_key=self.concurrency_key,
        )


@pydantic.dataclasses.dataclass(
    frozen=True, config=ConfigDict(json_schema_extra={"examples": [RUN_EXAMPLE]})
)
class RunOut(RunView):
    """A run as the API shows it: the fields of the read model
    (``runyard.reads.run_view.RunView``)."""


class RunPage(BaseModel):
    """One page of runs, newest first, with the cursor of the next page."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"items": [RUN_EXAMPLE], "next_cursor": None}]}
    )

    items: list[RunOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null: end")


class ToolOut(BaseModel):
    """A registered tool and its limits."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "echo",
                    "description": "Return the input as the result",
                    "image": "runyard/toolbox:latest",
                    "timeout_seconds": 30,
                    "memory_mb": 64,
                    "cpus": 0.5,
                    "pids_limit": 64,
                    "max_attempts": 1,
                    "network": "none",
                    "runtime": None,
                    "isolation": "namespaces",
                    "queue": "default",
                    "max_timeout_seconds": 30,
                    "max_memory_mb": 64,
                    "max_cpus": 0.5,
                    "input_schema": {"type": "object"},
                }
            ]
        }
    )

    name: str
    description: str
    image: str = Field(description="The image, or for a built tool the tag of its current build")
    timeout_seconds: int
    memory_mb: int
    cpus: float
    pids_limit: int
    max_attempts: int
    network: str = Field(
        description="'none' (no network), 'bridge' or the name of an operator's network"
    )
    egress: list[str] | None = Field(
        default=None,
        description="The only destinations it can reach (host:port), through the platform's "
        "filtering proxy; null: its network alone decides",
    )
    runtime: str | None = Field(
        default=None, description="The engine's runtime its containers run under; null: runc"
    )
    isolation: str = Field(
        default="namespaces",
        description="Its isolation tier: 'namespaces' (runc, the host kernel) or 'gvisor' (runsc)",
    )
    queue: str = Field(default="default", description="The worker pool its runs wait for")
    max_timeout_seconds: int = Field(description="The most a run's limits may ask for")
    max_memory_mb: int = Field(description="The most a run's limits may ask for")
    max_cpus: float = Field(description="The most a run's limits may ask for")
    input_schema: dict[str, Any] | None
    build: ToolBuildOut | None = Field(
        default=None, description="For a tool built from source: its digest and builds"
    )


class FieldError(BaseModel):
    """One failing field of a request."""

    field: str
    message: str
    type: str | None = None
    in_: str | None = Field(default=None, alias="in")


class ProblemOut(BaseModel):
    """An RFC 9457 problem document; ``code`` is stable and meant for programs."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": "about:blank",
                    "title": "Unprocessable Content",
                    "status": 422,
                    "code": "validation_error",
                    "detail": "priority: Input should be a valid integer",
                    "field": "priority",
                }
            ]
        },
    )

    type: str = "about:blank"
    title: str
    status: int
    code: str
    detail: str
    field: str | None = None
    errors: list[FieldError] | None = None


class HealthOut(BaseModel):
    """Liveness or readiness."""

    status: str
    revision: str | None = None


KEY_EXAMPLE: dict[str, Any] = {
    "prefix": "3f9c2a71b04e",
    "tenant": "acme",
    "name": "ci",
    "scopes": [],
    "created_at": "2026-11-26T10:00:00.000000Z",
    "last_used_at": "2026-11-26T10:05:00.000000Z",
    "revoked_at": None,
}


class KeyCreate(BaseModel):
    """A new API key for a tenant; ``admin`` keys see every tenant and manage keys."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"tenant": "acme", "name": "ci"},
                {"tenant": "acme", "name": "nightly", "max_priority": 10},
                {"tenant": "ops", "admin": True, "name": "operator"},
            ]
        },
    )

    tenant: str = Field(min_length=1, max_length=128)
    admin: bool = False
    name: str | None = Field(default=None, max_length=200, description="A label for the key")
    max_priority: int = Field(
        default=0, ge=-100, le=100, description="The highest priority its runs may ask for"
    )
    tools: list[ToolName] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KEY_TOOLS,
        description="The only tools it may run, list and schedule (left out: every tool)",
    )


class KeyUpdate(BaseModel):
    """What an admin may change on a key: at least one of them."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"max_priority": 50}, {"tools": ["echo"]}, {"all_tools": True}]
        },
    )

    max_priority: int | None = Field(
        default=None, ge=-100, le=100, description="The highest priority its runs may ask for"
    )
    tools: list[ToolName] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KEY_TOOLS,
        description="The only tools it may run from now on",
    )
    all_tools: bool = Field(default=False, description="Let it run every tool again")

    @model_validator(mode="after")
    def _one_change(self) -> KeyUpdate:
        if self.max_priority is None and self.tools is None and not self.all_tools:
            raise ValueError("give max_priority, tools or all_tools")
        if self.tools is not None and self.all_tools:
            raise ValueError("give tools or all_tools, not both")
        return self


class KeyOut(BaseModel):
    """An API key without its secret or hash: the prefix names it."""

    model_config = ConfigDict(json_schema_extra={"examples": [KEY_EXAMPLE]})

    prefix: str
    tenant: str
    name: str | None
    scopes: list[str]
    max_priority: int = Field(default=0, description="The highest priority its runs may ask for")
    tools: list[str] | None = Field(
        default=None, description="The only tools it may run (null: every tool)"
    )
    created_at: datetime
    last_used_at: datetime | None = Field(description="Written at most once a minute")
    revoked_at: datetime | None


class KeyCreated(KeyOut):
    """A key just created: ``key`` is shown this once and cannot be recovered."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{**KEY_EXAMPLE, "last_used_at": None, "key": "ry_3f9c2a71b04e_…"}]
        }
    )

    key: str = Field(description="Send as 'Authorization: Bearer <key>'; shown only once")


class ArtifactOut(BaseModel):
    """One file a run's tool left under /runyard/out."""

    path: str = Field(description="Relative POSIX path under /runyard/out")
    size: int = Field(description="Bytes")
    sha256: str = Field(description="SHA-256 of the content, hex (also the download's ETag)")
    url: str = Field(description="Where to download it (the path percent-encoded)")


class ArtifactList(BaseModel):
    """A terminal run's artifacts, by path."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "run_id": RUN_EXAMPLE["id"],
                    "count": 1,
                    "total_bytes": 12,
                    "tar_url": f"/v1/runs/{RUN_EXAMPLE['id']}/artifacts.tar",
                    "artifacts": [
                        {
                            "path": "reports/summary.txt",
                            "size": 12,
                            "sha256": "a948904f2f0f479b8f8197694b30184b"
                            "0d2ed1c1cd2a1ec0fb85d299a192a447",
                            "url": f"/v1/runs/{RUN_EXAMPLE['id']}/artifacts/reports/summary.txt",
                        }
                    ],
                }
            ]
        }
    )

    run_id: str
    count: int
    total_bytes: int
    tar_url: str
    artifacts: list[ArtifactOut]


class BuildOut(BaseModel):
    """A build of a tool built from source: one digest on one engine."""

    id: uuid.UUID
    tag: str = Field(description="runyard-build/<tool>:<first 12 hex of the digest>")
    tool: str
    digest: str = Field(description="sha256 of the context files, the Dockerfile and the args")
    engine_id: str
    status: Literal["queued", "building", "ready", "failed"]
    attempts: int
    max_attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    deadline_at: datetime | None
    locked_by: str | None = Field(description="The worker building it now")
    error: str | None = Field(description="Why it failed, with the log's tail")
    image_id: str | None
    log_size: int = Field(description="Characters of output ever written (the log keeps a tail)")
    log: str | None = Field(default=None, description="The log's tail (one build only)")


class ToolBuildOut(BaseModel):
    """A built tool's current digest and its build's status on each engine."""

    tag: str
    digest: str
    engines: dict[str, str] = Field(description="engine id -> queued|building|ready|failed")
    error: str | None = Field(default=None, description="Why its source cannot be used now")


class BuildRequested(BaseModel):
    """What ``POST /v1/tools/{name}/build`` queued."""

    tool: str
    tag: str
    digest: str
    queued: int = Field(description="Builds queued (again) on engines with a live worker")
