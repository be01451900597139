"""What the API returns and accepts, as pydantic models (unknown fields are ignored, so a
newer server does not break an older client)."""

from __future__ import annotations

import enum
import uuid
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    """Frozen, and lenient about fields a newer API may add."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class RunStatus(enum.StrEnum):
    """Where a run is; the last four never change again."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True once the run has ended."""
        return self not in (RunStatus.QUEUED, RunStatus.RUNNING)


class Limits(Model):
    """Limits one run asks for instead of its tool's (each up to the tool's ``max_*``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_seconds: int | None = None
    memory_mb: int | None = None
    cpus: float | None = None


class Run(Model):
    """A run as ``GET /v1/runs/{id}`` shows it."""

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
    waiting_for: str | None = None
    depends_on: tuple[uuid.UUID, ...] = ()
    waiting_on: tuple[uuid.UUID, ...] = ()
    batch_id: uuid.UUID | None = None
    ref: str | None = None
    rerun_of: uuid.UUID | None = None
    run_at: datetime | None = None
    schedule_id: uuid.UUID | None = None
    schedule_slot: datetime | None = None
    concurrency_key: str | None = None
    trace_id: str | None = None

    @property
    def done(self) -> bool:
        """Whether the run has ended (any terminal status)."""
        return self.status.is_terminal

    @property
    def succeeded(self) -> bool:
        """Whether the run ended successfully."""
        return self.status is RunStatus.SUCCEEDED


class RunPage(Model):
    """One page of runs, newest first."""

    items: tuple[Run, ...]
    next_cursor: str | None


class ToolBuild(Model):
    """A built tool's current digest and its build's status per engine."""

    tag: str
    digest: str
    engines: dict[str, str]
    error: str | None = None


class Tool(Model):
    """A registered tool, its limits and input schema."""

    name: str
    description: str
    image: str
    timeout_seconds: int
    memory_mb: int
    cpus: float
    pids_limit: int
    max_attempts: int
    network: str
    egress: list[str] | None = None
    runtime: str | None = None
    isolation: str = "namespaces"
    queue: str = "default"
    max_timeout_seconds: int
    max_memory_mb: int
    max_cpus: float
    input_schema: dict[str, Any] | None
    build: ToolBuild | None = None


class Build(Model):
    """A build of a tool built from source: one digest on one engine (``log``: its tail,
    only when one build is read)."""

    id: uuid.UUID
    tag: str
    tool: str
    digest: str
    engine_id: str
    status: str
    attempts: int
    max_attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    deadline_at: datetime | None
    locked_by: str | None
    error: str | None
    image_id: str | None
    log_size: int
    log: str | None = None


class BuildRequested(Model):
    """What a build request queued: ``queued`` builds on engines with a live worker."""

    tool: str
    tag: str
    digest: str
    queued: int


class TenantWebhook(Model):
    """A tenant's default webhook; ``secret`` only in the answer that made it (once)."""

    tenant: str
    url: str | None
    has_secret: bool
    events: list[str]
    deadline_lead_seconds: int
    secret: str | None = None


class Artifact(Model):
    """One file a run's tool left under /runyard/out, with its SHA-256."""

    path: str
    size: int
    sha256: str
    url: str


class ArtifactList(Model):
    """A terminal run's artifacts."""

    run_id: str
    count: int
    total_bytes: int
    tar_url: str
    artifacts: tuple[Artifact, ...]


class BatchItem(Model):
    """One run of a batch to submit: a ``ref`` the others may name in ``depends_on``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    input: Any = Field(default_factory=dict)
    ref: str | None = None
    priority: int | None = None
    limits: Limits | None = None
    depends_on: tuple[str, ...] = ()
    run_at: datetime | None = None
    callback_url: str | None = None
    concurrency_key: str | None = None


class BatchRun(Model):
    """A run of a batch: the latest run of its ref."""

    ref: str
    run_id: uuid.UUID
    tool: str
    status: RunStatus
    error_code: str | None
    depends_on: tuple[str, ...]
    rerun_of: uuid.UUID | None
    requested_at: datetime
    finished_at: datetime | None


class Batch(Model):
    """A batch: its status, counts by status and its runs by ref; ``run_ids`` (ref to run
    id) comes with a submit or a retry."""

    id: uuid.UUID
    status: str
    created_at: datetime
    size: int
    counts: dict[str, int]
    runs: tuple[BatchRun, ...] = ()
    run_ids: dict[str, uuid.UUID] = Field(default_factory=dict)

    @property
    def done(self) -> bool:
        """Whether no run of the batch is queued or running."""
        return self.status not in ("queued", "running")


class BatchSummary(Model):
    """A batch in a list: status and counts, without its runs."""

    id: uuid.UUID
    status: str
    created_at: datetime
    size: int
    counts: dict[str, int]


class BatchPage(Model):
    """One page of batches, newest first."""

    items: tuple[BatchSummary, ...]
    next_cursor: str | None


class Schedule(Model):
    """A recurring schedule as ``GET /v1/schedules/{id}`` shows it."""

    id: uuid.UUID
    tool: str
    input: Any
    priority: int
    cron: str | None
    every_seconds: int | None
    timezone: str
    start_at: datetime
    end_at: datetime | None
    catch_up: str
    paused: bool
    next_slot_at: datetime | None
    created_at: datetime
    updated_at: datetime
    fired: int
    skipped: int
    last_slot_at: datetime | None
    last_run_id: uuid.UUID | None
    last_error: str | None


class SchedulePage(Model):
    """One page of schedules, newest first."""

    items: tuple[Schedule, ...]
    next_cursor: str | None


class FieldProblem(Model):
    """One failing field of a refused request."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    field: str
    message: str
    type: str | None = None
    in_: str | None = Field(default=None, alias="in")


class Problem(Model):
    """The API's error document (``application/problem+json``); ``code`` is for programs."""

    model_config = ConfigDict(frozen=True, extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    code: str
    detail: str
    field: str | None = None
    errors: tuple[FieldProblem, ...] | None = None


class UsageLine(Model):
    """One tool's, day's or tenant's usage summed over a report's window."""

    key: str
    runs: int
    attempts: int
    cpu_seconds: float
    wall_seconds: float
    memory_peak_bytes: int
    memory_byte_seconds: float
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    # "run": attempts of runs; "build": image builds; "all": a report's total.
    kind: str = "run"


class UsageReport(Model):
    """Usage over whole UTC days (``from_`` to ``to``, both included), by ``group_by``;
    ``tenant`` None: every tenant's (an admin's report)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    from_: date = Field(alias="from")
    to: date
    group_by: str
    tenant: str | None
    lines: tuple[UsageLine, ...]
    total: UsageLine
