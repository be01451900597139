"""ORM table definitions: the Alembic target and the shape of plain reads.

State changes never go through these classes; ``runyard.queue`` owns them with written-out SQL.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from runyard.domain.states import RunMode, RunStatus

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with a naming convention so migrations name constraints stably."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _status_column_type() -> Enum:
    return Enum(
        RunStatus,
        name="run_status",
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class ToolRun(Base):
    """The user-facing record of one tool run."""

    __tablename__ = "tool_runs"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_tool_runs_tenant_idempotency_key"),
        CheckConstraint("mode IN ('queue', 'sync')", name="mode_known"),
        Index(
            "ix_tool_runs_tenant_requested", "tenant", text("requested_at DESC"), text("id DESC")
        ),
        Index("ix_tool_runs_status_mode", "status", "mode"),
        Index(
            "ix_tool_runs_batch",
            "batch_id",
            "requested_at",
            postgresql_where=text("batch_id IS NOT NULL"),
        ),
        Index(
            "ix_tool_runs_tenant_active",
            "tenant",
            "status",
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        Index(
            "ix_tool_runs_started_at",
            "started_at",
            postgresql_where=text("started_at IS NOT NULL"),
        ),
        # Retention deletes terminal runs oldest first (runyard.queue.sql.PRUNE).
        Index(
            "ix_tool_runs_finished_terminal",
            "finished_at",
            postgresql_where=text("status IN ('succeeded', 'failed', 'timed_out', 'cancelled')"),
        ),
        # A batch's retry asks whether its runs were re-run already (LOCK_BATCH_FOR_RETRY).
        Index("ix_tool_runs_rerun_of", "rerun_of", postgresql_where=text("rerun_of IS NOT NULL")),
        # A schedule's slot makes at most one run (runyard.schedules, migration 0021).
        Index(
            "uq_tool_runs_schedule_slot",
            "schedule_id",
            "schedule_slot",
            unique=True,
            postgresql_where=text("schedule_id IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant: Mapped[str] = mapped_column(Text)
    tool: Mapped[str] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    image_digest: Mapped[str | None] = mapped_column(Text)
    input: Mapped[Any] = mapped_column(JSONB)
    status: Mapped[RunStatus] = mapped_column(
        _status_column_type(), server_default=RunStatus.QUEUED.value
    )
    mode: Mapped[str] = mapped_column(Text, server_default=RunMode.QUEUE.value)
    requested_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="1")
    exit_code: Mapped[int | None] = mapped_column(Integer)
    result: Mapped[Any | None] = mapped_column(JSONB)
    stdout: Mapped[str | None] = mapped_column(Text)
    stderr: Mapped[str | None] = mapped_column(Text)
    stdout_truncated: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    stderr_truncated: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # Where the run's completion webhook goes (else the tenant's default, if any).
    callback_url: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    request_hash: Mapped[str | None] = mapped_column(Text)
    # The artifact set its finalize published (runyard.artifacts); NULL: none kept.
    artifact_set: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # Workflows (docs/workflows.md): the batch and its name for the run in it, the run this
    # one re-runs, when it may start, and whether any run depends on it.
    batch_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True), ForeignKey("batches.id"))
    ref: Mapped[str | None] = mapped_column(Text)
    rerun_of: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Read by the trigger that settles dependents (migration 0011): false, it never fires.
    has_dependents: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # The caller's flow-control key (e.g. a customer id): per-key limits of its tool apply.
    concurrency_key: Mapped[str | None] = mapped_column(Text)
    # The schedule that made it and the slot it fired for (docs/workflows.md); else NULL.
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    schedule_slot: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Batch(Base):
    """Runs submitted together as one graph; their status is the batch's."""

    __tablename__ = "batches"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_batches_tenant_idempotency_key"),
        Index("ix_batches_tenant_created", "tenant", text("created_at DESC"), text("id DESC")),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    size: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    request_hash: Mapped[str | None] = mapped_column(Text)


class ToolRunDep(Base):
    """An edge of a workflow: ``run_id`` may start only once ``depends_on`` has succeeded."""

    __tablename__ = "tool_run_deps"
    __table_args__ = (Index("ix_tool_run_deps_depends_on", "depends_on"),)

    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE"), primary_key=True
    )
    depends_on: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE"), primary_key=True
    )


class TenantRunCount(Base):
    """One of a tenant's rows of queued, running and stored runs; their sum is the tenant's
    count.

    Written by the triggers on ``tool_runs`` (migrations 0006 and 0016), never by application
    code, except the window of row 0, which admission starts anew (``TENANT_COUNTS_CTES``).
    """

    __tablename__ = "tenant_run_counts"

    tenant: Mapped[str] = mapped_column(Text, primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    queued: Mapped[int] = mapped_column(BigInteger, server_default="0")
    running: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Row 0 only: runs created since ``window_started_at`` (admission starts a new window).
    window_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    window_created: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Runs kept in the database, whatever their status (their sum over the tenant's rows).
    stored: Mapped[int] = mapped_column(BigInteger, server_default="0")


class ToolRunJob(Base):
    """The queue entry of a run, with its lease, fencing and adoption columns."""

    __tablename__ = "tool_run_jobs"
    __table_args__ = (
        # No index leads with ``status``: fenced writes find their job by primary key (0014).
        # The reaper's expiry scan; fenced writes find their job by primary key (0014).
        Index(
            "ix_tool_run_jobs_lease_expiry",
            "locked_until",
            postgresql_where=text("status = 'running' AND locked_until IS NOT NULL"),
        ),
        Index(
            "ix_tool_run_jobs_queued",
            "queue",
            text("priority DESC"),
            "created_at",
            postgresql_where=text("status = 'queued'"),
        ),
        # The fair claim's per-tenant probe: each tenant's oldest queued jobs of a queue, by
        # the build they wait for ('' for none), so runs of a build not ready on the claiming
        # engine are skipped a group at a time.
        Index(
            "ix_tool_run_jobs_queued_tenant",
            "queue",
            "tenant",
            "build_tag",
            text("priority DESC"),
            "created_at",
            # Held jobs (flow control) are left out: a claim never steps over them.
            postgresql_where=text(
                "status = 'queued' AND waiting_on = 0 AND available_at < 'infinity'"
            ),
        ),
        # The builds queued runs wait for (a skip scan lists them).
        Index(
            "ix_tool_run_jobs_queued_build",
            "build_tag",
            "queue",
            postgresql_where=text("status = 'queued' AND build_tag <> ''"),
        ),
        Index(
            "ix_tool_run_jobs_adoptable",
            "engine_id",
            text("priority DESC"),
            "created_at",
            postgresql_where=text("status = 'running' AND locked_until IS NULL"),
        ),
        # Flow control (runyard.queue.flow, migration 0021): the held jobs in claim order.
        Index(
            "ix_tool_run_jobs_flow_held",
            text("priority DESC"),
            "created_at",
            postgresql_where=text(
                "status = 'queued' AND available_at = 'infinity' AND flow_scopes IS NOT NULL"
            ),
        ),
        CheckConstraint("attempts >= 0", name="attempts_non_negative"),
        CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
        CheckConstraint("waiting_on >= 0", name="waiting_on_non_negative"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE"), unique=True
    )
    status: Mapped[RunStatus] = mapped_column(
        _status_column_type(), server_default=RunStatus.QUEUED.value
    )
    queue: Mapped[str] = mapped_column(Text, server_default="default")
    tenant: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="1")
    timeout_seconds: Mapped[int] = mapped_column(Integer)
    available_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    locked_by: Mapped[str | None] = mapped_column(Text)
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_token: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    engine_id: Mapped[str | None] = mapped_column(Text)
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Written (fenced) just before the attempt's container is created: an adopter that finds
    # no container and no such mark knows the tool never ran and the attempt never began.
    container_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    # Dependencies not yet succeeded: the claim takes only jobs at 0.
    waiting_on: Mapped[int] = mapped_column(Integer, server_default="0")
    # The image tag of the build the run needs ('' for an image tool): claimable on an engine
    # only once that engine's build of it is ready.
    build_tag: Mapped[str] = mapped_column(Text, server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The flow-control scopes whose limits hold it back (NULL: none); held until released.
    flow_scopes: Mapped[list[str] | None] = mapped_column(ARRAY(Text))


class ToolRunEvent(Base):
    """One append-only event of a run; ``id`` is global and doubles as the SSE event id.

    Readers order a run's events by ``(xact_id, id)``, not by ``id`` alone
    (runyard.reads.events_sql).
    """

    __tablename__ = "tool_run_events"
    __table_args__ = (Index("ix_tool_run_events_run_id_xact_id_id", "run_id", "xact_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    # The inserting transaction (pg_current_xact_id(), 0 for rows older than the column):
    # ids are drawn before commit, so id order is not commit order, and a reader paging by
    # id alone skips a row that commits after a later one.
    xact_id: Mapped[int] = mapped_column(
        BigInteger, server_default=text("CAST(CAST(pg_current_xact_id() AS text) AS bigint)")
    )
    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE")
    )
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    type: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))


class Worker(Base):
    """One worker process and the Docker engine it drives."""

    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_engine_id_last_seen_at", "engine_id", "last_seen_at"),)

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    engine_id: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    concurrency: Mapped[int] = mapped_column(Integer, server_default="1")
    queues: Mapped[list[str]] = mapped_column(
        ARRAY(Text), server_default=text("'{default}'::text[]")
    )
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_seen_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class DeletedRun(Base):
    """The tombstone of a deleted run that had a container: the sweep still removes what the
    engine holds of it (migration 0017 writes them by trigger; the sweep prunes them)."""

    __tablename__ = "deleted_runs"

    run_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    deleted_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True
    )


class ApiKey(Base):
    """An API key: only its hash is stored; ``prefix`` finds the row without the secret."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    prefix: Mapped[str] = mapped_column(Text, unique=True)
    key_hash: Mapped[str] = mapped_column(Text)
    tenant: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'::text[]"))
    # The highest priority a run submitted with this key may ask for.
    max_priority: Mapped[int] = mapped_column(Integer, server_default="0")
    # The tools this key may run, list and schedule (NULL: every tool; migration 0025).
    tools: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TenantSettings(Base):
    """A tenant's default webhook URL and its signing secret (one row per tenant)."""

    __tablename__ = "tenant_settings"

    tenant: Mapped[str] = mapped_column(Text, primary_key=True)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    # Standard Webhooks form (``whsec_`` + base64); needed in the clear to sign deliveries.
    webhook_secret: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # The events its URL and its runs' callback URLs receive (migration 0024).
    webhook_events: Mapped[list[str]] = mapped_column(
        ARRAY(Text), server_default=text("ARRAY['run.completed']")
    )
    # How long before an attempt's deadline ``run.deadline_approaching`` goes out.
    deadline_lead_seconds: Mapped[int] = mapped_column(Integer, server_default="60")


class WebhookDelivery(Base):
    """One completion webhook of a run: written by a trigger when the run becomes terminal
    (migration 0009), then claimed, attempted and settled by ``runyard.webhooks.delivery``."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # The fair claim's skip scan over tenants and each tenant's oldest due rows (0018).
        Index(
            "ix_webhook_deliveries_tenant_due",
            "tenant",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
        # Attempts in flight, counted per tenant and destination by every claim.
        Index(
            "ix_webhook_deliveries_leased",
            "next_attempt_at",
            postgresql_where=text("status = 'pending' AND lease_token IS NOT NULL"),
        ),
        CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status_known"),
        CheckConstraint(
            "event IN ('run.completed', 'run.started', 'run.deadline_approaching', "
            "'sandbox.ended')",
            name="event_known",
        ),
        # Each attempt's started and deadline notices exist once, whoever writes them.
        Index(
            "uq_webhook_deliveries_run_event_attempt",
            "run_id",
            "event",
            "attempt",
            unique=True,
            postgresql_where=text("event <> 'run.completed'"),
        ),
    )

    # Also the ``webhook-id`` of every attempt: a receiver drops duplicates by it.
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE"), index=True
    )
    tenant: Mapped[str] = mapped_column(Text)
    url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # When it is due; a claim moves it a lease ahead, so a delivery whose process died is
    # due again when the lease runs out.
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lease_token: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    locked_by: Mapped[str | None] = mapped_column(Text)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Which event (migration 0024); the attempt for the once-per-attempt events; the order the
    # run's deliveries were written in (none for rows from before: they come first).
    event: Mapped[str] = mapped_column(Text, server_default="run.completed")
    attempt: Mapped[int | None] = mapped_column(Integer)
    # Its default draws from ``webhook_deliveries_seq_seq`` (set by the migration).
    seq: Mapped[int | None] = mapped_column(BigInteger)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class WebhookDestination(Base):
    """A tenant's circuit breaker of a webhook destination (``host:port``) that failed lately
    for it (``runyard.domain.webhook_fairness``); a closed breaker has no row."""

    __tablename__ = "webhook_destinations"

    tenant: Mapped[str] = mapped_column(Text, primary_key=True)
    destination: Mapped[str] = mapped_column(Text, primary_key=True)
    # Attempts in a row that got no HTTP answer.
    failures: Mapped[int] = mapped_column(Integer, server_default="0")
    # No attempt before this (the cool-down, or a probe's lease while it is in flight).
    open_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RunArtifact(Base):
    """One file of one artifact set of a run (``runyard.artifact_stores.postgres``)."""

    __tablename__ = "run_artifacts"
    __table_args__ = (CheckConstraint("size >= 0", name="size_not_negative"),)

    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE"), primary_key=True
    )
    set_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    path: Mapped[str] = mapped_column(Text, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(Text)
    chunk_size: Mapped[int] = mapped_column(Integer)


class RunArtifactChunk(Base):
    """About a MiB of one artifact file's content; ``seq`` counts from 0."""

    __tablename__ = "run_artifact_chunks"

    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE"), primary_key=True
    )
    set_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    path: Mapped[str] = mapped_column(Text, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class ToolBuildContext(Base):
    """The source of one build (a tool at one digest), kept so any worker can build it."""

    __tablename__ = "tool_build_contexts"

    tag: Mapped[str] = mapped_column(Text, primary_key=True)
    tool: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(Text)
    dockerfile: Mapped[str] = mapped_column(Text)
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    network: Mapped[str] = mapped_column(Text, server_default="none")
    timeout_seconds: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(BigInteger)
    context: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ToolBuild(Base):
    """One build of a digest on one engine, leased to a worker of that engine like a job."""

    __tablename__ = "tool_builds"
    __table_args__ = (
        UniqueConstraint("tag", "engine_id", name="uq_tool_builds_tag_engine_id"),
        Index(
            "ix_tool_builds_open",
            "engine_id",
            "created_at",
            postgresql_where=text("status IN ('queued', 'building')"),
        ),
        CheckConstraint("status IN ('queued', 'building', 'ready', 'failed')", name="status_known"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tag: Mapped[str] = mapped_column(
        Text, ForeignKey("tool_build_contexts.tag", ondelete="CASCADE")
    )
    tool: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(Text)
    engine_id: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, server_default="queued")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="3")
    available_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    locked_by: Mapped[str | None] = mapped_column(Text)
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_token: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The first claim of this round of the build (a rebuild clears it): its wall time's start.
    first_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The tail of the build's output (capped) and how many characters were ever appended.
    log: Mapped[str] = mapped_column(Text, server_default="")
    log_size: Mapped[int] = mapped_column(BigInteger, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    image_id: Mapped[str | None] = mapped_column(Text)
    # The W3C traceparent of the build's span when it was traced: waits for it link to it.
    traceparent: Mapped[str | None] = mapped_column(Text)


class Schedule(Base):
    """A recurring schedule: a tool and input fired at each slot of its cadence."""

    __tablename__ = "schedules"
    __table_args__ = (
        CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="one_cadence"),
        CheckConstraint("catch_up IN ('none', 'one', 'all')", name="catch_up_known"),
        Index("ix_schedules_tenant_created", "tenant", text("created_at DESC"), text("id DESC")),
        # The scheduler's scan for due schedules (runyard.schedules.sql.TAKE_DUE).
        Index(
            "ix_schedules_due",
            "next_slot_at",
            postgresql_where=text("NOT paused AND next_slot_at IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant: Mapped[str] = mapped_column(Text)
    tool: Mapped[str] = mapped_column(Text)
    input: Mapped[Any] = mapped_column(JSONB)
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    cron: Mapped[str | None] = mapped_column(Text)
    every_seconds: Mapped[int | None] = mapped_column(Integer)
    timezone: Mapped[str] = mapped_column(Text)
    start_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    end_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    catch_up: Mapped[str] = mapped_column(Text)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # The first slot not yet decided (fired or skipped); NULL: no slot left.
    next_slot_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    fired: Mapped[int] = mapped_column(BigInteger, server_default="0")
    skipped: Mapped[int] = mapped_column(BigInteger, server_default="0")
    last_slot_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_run_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    last_error: Mapped[str | None] = mapped_column(Text)


class FlowCounter(Base):
    """One flow-control scope: the row its gates lock, its jobs in flight, its token bucket
    (NULL: full)."""

    __tablename__ = "flow_counters"

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    # Released or running jobs of the scope: gates add, the trigger of migration 0021 takes.
    in_flight: Mapped[int] = mapped_column(Integer, server_default="0")
    # The limits the last gate applied (NULL: none), read to pass over full scopes.
    max_running: Mapped[int | None] = mapped_column(Integer)
    per_second: Mapped[float | None] = mapped_column(Float)
    tokens: Mapped[float | None] = mapped_column(Float)
    refilled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Sandbox(Base):
    """What a run that is a sandbox has beyond its run (``runyard.sandboxes``)."""

    __tablename__ = "sandboxes"
    __table_args__ = (Index("ix_sandboxes_tenant_created", "tenant", "created_at"),)

    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tool_runs.id", ondelete="CASCADE"), primary_key=True
    )
    tenant: Mapped[str] = mapped_column(Text)
    tool: Mapped[str] = mapped_column(Text)
    idle_timeout_seconds: Mapped[int] = mapped_column(Integer)
    max_execs: Mapped[int] = mapped_column(Integer)
    last_active_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # When its owner first found the container running and its workspace made.
    ready_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Commands asked of it so far (at most ``MAX_EXECS_TOTAL``).
    exec_count: Mapped[int] = mapped_column(Integer, server_default="0")


class SandboxExec(Base):
    """One command asked of a sandbox; ``*_end`` are the bytes of each stream stored so far."""

    __tablename__ = "sandbox_execs"
    __table_args__ = (
        Index("ix_sandbox_execs_run", "run_id", "created_at"),
        Index(
            "ix_sandbox_execs_open",
            "run_id",
            "created_at",
            postgresql_where=text("status <> 'finished'"),
        ),
        CheckConstraint("status IN ('pending', 'running', 'finished')", name="status_known"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("sandboxes.run_id", ondelete="CASCADE")
    )
    command: Mapped[list[str]] = mapped_column(JSONB)
    stdin: Mapped[bytes] = mapped_column(LargeBinary, server_default=text("''::bytea"))
    env: Mapped[dict[str, str]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    cwd: Mapped[str] = mapped_column(Text)
    timeout_seconds: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(Text, server_default="pending")
    exit_code: Mapped[int | None] = mapped_column(Integer)
    timed_out: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    error: Mapped[str | None] = mapped_column(Text)
    stdout_end: Mapped[int] = mapped_column(BigInteger, server_default="0")
    stderr_end: Mapped[int] = mapped_column(BigInteger, server_default="0")
    truncated: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SandboxExecChunk(Base):
    """Bytes ``[offset, offset + length)`` of one stream of an exec, secrets masked in ``data``."""

    __tablename__ = "sandbox_exec_chunks"
    __table_args__ = (CheckConstraint("stream IN ('stdout', 'stderr')", name="stream_known"),)

    exec_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("sandbox_execs.id", ondelete="CASCADE"), primary_key=True
    )
    stream: Mapped[str] = mapped_column(Text, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    length: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=True))


class AttemptUsageRecord(Base):
    """What one attempt's container consumed: written once, under the attempt's lease, before
    its finalize (``runyard.usage``); kept when retention deletes the run."""

    __tablename__ = "attempt_usage"
    __table_args__ = (
        Index("ix_attempt_usage_tenant_recorded", "tenant", "recorded_at"),
        Index("ix_attempt_usage_recorded", "recorded_at"),
    )

    run_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text)
    tool: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    cpu_seconds: Mapped[float] = mapped_column(Float)
    memory_peak_bytes: Mapped[int] = mapped_column(BigInteger)
    memory_avg_bytes: Mapped[int] = mapped_column(BigInteger)
    wall_seconds: Mapped[float] = mapped_column(Float)
    disk_bytes: Mapped[int] = mapped_column(BigInteger)
    net_rx_bytes: Mapped[int | None] = mapped_column(BigInteger)
    net_tx_bytes: Mapped[int | None] = mapped_column(BigInteger)


class BuildUsage(Base):
    """What one build of an image consumed: written once, under the build's lease, before it
    is recorded ready or failed (``runyard.usage``); charged to the tenant of the oldest run
    waiting for it (none: a platform-level build)."""

    __tablename__ = "build_usage"
    __table_args__ = (
        Index("ix_build_usage_tenant_recorded", "tenant", "recorded_at"),
        Index("ix_build_usage_recorded", "recorded_at"),
    )

    build_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    # The first claim of the build's round: an admin's rebuild of the same row is another.
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    tag: Mapped[str] = mapped_column(Text)
    tool: Mapped[str] = mapped_column(Text)
    engine_id: Mapped[str] = mapped_column(Text)
    tenant: Mapped[str | None] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    wall_seconds: Mapped[float] = mapped_column(Float)
    # None: the engine did not let it be measured (see docs/operations.md).
    cpu_seconds: Mapped[float | None] = mapped_column(Float)
    memory_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)


class TenantUsageTotals(Base):
    """A tenant's usage summed since it began: the Prometheus counters read it per scrape."""

    __tablename__ = "tenant_usage_totals"

    tenant: Mapped[str] = mapped_column(Text, primary_key=True)
    attempts: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cpu_seconds: Mapped[float] = mapped_column(Float, server_default="0")
    wall_seconds: Mapped[float] = mapped_column(Float, server_default="0")
    memory_byte_seconds: Mapped[float] = mapped_column(Float, server_default="0")
    disk_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")
    net_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")


class TenantUsageDay(Base):
    """A tenant's usage of one UTC day summed: what the daily CPU quota reads."""

    __tablename__ = "tenant_usage_days"

    tenant: Mapped[str] = mapped_column(Text, primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    attempts: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cpu_seconds: Mapped[float] = mapped_column(Float, server_default="0")
