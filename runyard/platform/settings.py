"""Settings read from the environment (prefix ``RUNYARD_``), validated once in entry points."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runyard.domain.flow_limits import Limit
from runyard.domain.limit_bounds import BOUNDS
from runyard.platform.pooling import ConnectionPlan, Pooler, connection_plan


def _bounded(limit: str, default: float) -> Any:
    """An operator maximum for ``limit``: its default, within the limit's own bounds."""
    bound = BOUNDS[limit]
    return Field(default=default, ge=bound.floor, le=bound.ceiling)


class Settings(BaseSettings):
    """Every knob of the platform; built only by entry points and tests, never at import."""

    model_config = SettingsConfigDict(env_prefix="RUNYARD_", extra="ignore", frozen=True)

    database_url: str = ""
    # "transaction": database_url reaches Postgres through a transaction pooler (PgBouncer's
    # pool_mode=transaction): no prepared statements, no session settings at connect, and
    # LISTEN only on listen_database_url, a direct URL (without it the loops poll).
    database_pooler: Pooler = "none"
    # The transaction pooler carries protocol-level prepared statements (PgBouncer 1.21+ with
    # max_prepared_statements > 0): statements are prepared behind it too.
    database_pooler_prepares: bool = False
    listen_database_url: str = ""
    queue_enabled: bool = True
    sync_max_concurrency: int = Field(default=4, ge=1, le=1024)

    lease_seconds: float = Field(default=30.0, gt=0, le=3600)
    heartbeat_seconds: float | None = Field(default=None, gt=0)
    # One heartbeat round's bound, and the lease's safety margin (see heartbeat_round_timeout).
    heartbeat_timeout_seconds: float | None = Field(default=None, gt=0)
    reaper_interval_seconds: float = Field(default=5.0, gt=0)
    reaper_batch_size: int = Field(default=500, ge=1, le=10_000)
    engine_dead_after_seconds: float = Field(default=120.0, gt=0)
    # Terminal runs are deleted this long after they finished (fractions allowed; 0 keeps all).
    retention_days: float = Field(default=30.0, ge=0)
    retry_backoff_base_seconds: float = Field(default=2.0, ge=0)
    retry_backoff_max_seconds: float = Field(default=300.0, ge=0)

    worker_concurrency: int = Field(default=4, ge=1, le=256)
    worker_poll_seconds: float = Field(default=1.0, gt=0)
    worker_id: str | None = None
    # The queues this worker claims from (comma list); tools name theirs in the registry.
    worker_queues: str = Field(
        default="default", pattern=r"^\s*[A-Za-z0-9_.-]+(\s*,\s*[A-Za-z0-9_.-]+)*\s*$"
    )
    sweep_interval_seconds: float = Field(default=60.0, gt=0)
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    reaper_metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    sweep_grace_seconds: float = Field(default=60.0, ge=0)
    # A worker whose engine stops answering probes it again after a capped exponential
    # backoff (equal jitter) from base to max; released runs wait as long before re-adoption.
    engine_backoff_base_seconds: float = Field(default=1.0, gt=0)
    engine_backoff_max_seconds: float = Field(default=30.0, gt=0)

    tools_file: Path = Path("tools/tools.toml")
    # How often the API and each worker re-read the tools file (0: read once, at start).
    tools_reload_seconds: float = Field(default=5.0, ge=0, le=3600)
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    auth_disabled: bool = False
    max_wait_seconds: float = Field(default=60.0, ge=0)
    max_request_bytes: int = Field(default=1_048_576, ge=1024)
    max_json_depth: int = Field(default=64, ge=2, le=512)
    api_db_pool_size: int = Field(default=10, ge=1, le=500)
    # API processes behind one port (uvicorn workers), each with its own pool and LISTEN
    # connection: one process uses one core at most. Queue mode only.
    api_workers: int = Field(default=1, ge=1, le=64)

    # A sick database fails fast instead of hanging (docs/operations.md, "When the database
    # is sick"). libpq counts whole seconds, 2 at least.
    db_connect_timeout_seconds: int = Field(default=5, ge=2, le=300)
    db_keepalives_idle_seconds: int = Field(default=10, ge=1, le=3600)
    db_keepalives_interval_seconds: int = Field(default=5, ge=1, le=600)
    db_keepalives_count: int = Field(default=3, ge=1, le=100)
    db_statement_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    db_lock_timeout_seconds: float = Field(default=5.0, gt=0, le=3600)
    db_pool_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    db_retry_after_seconds: int = Field(default=2, ge=1, le=3600)

    # The dashboard under /ui: an API key becomes a signed, HttpOnly session cookie.
    ui_enabled: bool = True
    ui_session_secret: SecretStr | None = Field(default=None, min_length=32)
    ui_session_hours: float = Field(default=12.0, gt=0, le=24 * 30)
    ui_cookie_secure: bool = False
    # Where the dashboard links a run's trace: a URL with {trace_id} in it (e.g. a Jaeger's
    # https://jaeger.example/trace/{trace_id}); empty: the trace id is shown without a link.
    trace_url_template: str = Field(
        default="", max_length=2000, pattern=r"^(https?://\S*\{trace_id\}\S*)?$"
    )

    # Admission (0 = no cap): a full queue answers 503, a tenant at one of its caps 429.
    max_queue_depth: int = Field(default=100_000, ge=0)
    tenant_max_queued: int = Field(default=10_000, ge=0)
    tenant_max_running: int = Field(default=0, ge=0)
    retry_after_seconds: int = Field(default=2, ge=1, le=3600)
    # Runs a tenant may create per window, whatever becomes of them (failed or cancelled at
    # once included); the 429's Retry-After is the rest of the window.
    tenant_max_created_per_window: int = Field(default=100_000, ge=0)
    tenant_created_window_seconds: float = Field(default=3600.0, ge=1, le=7 * 86400)
    # Runs a tenant may keep in the database, finished ones included (until deleted or pruned).
    tenant_max_stored_runs: int = Field(default=1_000_000, ge=0)
    # CPU seconds each tenant's attempts may use per UTC day (0: no quota); once spent, its
    # new runs are refused with a 429 until midnight (docs/operations.md, "Usage").
    tenant_daily_cpu_seconds: float = Field(default=0.0, ge=0)
    # Dependencies (depends_on entries) one batch may hold in all: more is a 422.
    batch_max_dependencies: int = Field(default=10_000, ge=0)
    # Schedules (runyard.schedules): how many a tenant may keep (0: no cap); how often the
    # reaper's scheduler looks for due slots (0 turns it off there), and how late a slot may
    # fire and still count as on time (older ones follow the schedule's catch_up).
    tenant_max_schedules: int = Field(default=1000, ge=0)
    # Flow control (docs/operations.md#flow-control): each tenant's most runs in flight (released
    # to the workers or running) and runs started per second (0: no limit), enforced where
    # runs are claimed; and its submits per second (0: no limit; more is a 429).
    tenant_flow_max_running: int = Field(default=0, ge=0, le=1_000_000)
    tenant_starts_per_second: float = Field(default=0.0, ge=0, le=100_000)
    tenant_submits_per_second: float = Field(default=0.0, ge=0, le=100_000)

    def tenant_flow_limit(self) -> Limit:
        """Each tenant's flow limits (``runyard.domain.flow_limits``)."""
        return Limit(self.tenant_flow_max_running or None, self.tenant_starts_per_second or None)

    def tenant_submit_limit(self) -> Limit:
        """Each tenant's submit rate."""
        return Limit(None, self.tenant_submits_per_second or None)

    scheduler_interval_seconds: float = Field(default=1.0, ge=0, le=3600)
    scheduler_grace_seconds: float = Field(default=60.0, ge=0, le=86400)

    # Live events (SSE): LISTEN/NOTIFY wakes streams; the poll is only a safety net.
    events_poll_seconds: float = Field(default=2.0, gt=0, le=60)
    events_keepalive_seconds: float = Field(default=15.0, gt=0, le=300)
    events_max_stream_seconds: float = Field(default=900.0, gt=0)
    events_db_concurrency: int = Field(default=4, ge=1, le=100)
    max_event_streams: int = Field(default=1000, ge=1)

    # Operator maxima: a tool's registry entry may ask for up to these, never more; each stays
    # within the platform's own bounds (runyard.domain.limit_bounds).
    max_timeout_seconds: int = _bounded("timeout_seconds", 3600)
    max_memory_mb: int = _bounded("memory_mb", 4096)
    max_cpus: float = _bounded("cpus", 4.0)
    max_pids: int = _bounded("pids_limit", 1024)
    max_disk_mb: int = _bounded("disk_mb", 10240)
    stdout_cap_bytes: int = _bounded("stdout_cap_bytes", 1_048_576)
    result_cap_bytes: int = _bounded("result_cap_bytes", 1_048_576)
    stop_grace_seconds: float = Field(default=5.0, ge=0)
    docker_timeout_seconds: float = Field(default=30.0, gt=0)
    # Where attempts' /runyard is made (runyard.runners.docker.inputs): "auto" writes it into a
    # directory under /var/lib/runyard/attempts when the worker is root and a probe proves the
    # engine sees that directory, else uploads; an absolute path forces host directories
    # there; "upload" (or "off", or empty) forces uploads.
    host_workdir_root: str = "auto"
    # Artifacts (files a tool leaves under /runyard/out): kept in Postgres unless this names
    # an absolute directory every worker and API host sees at the same path.
    artifacts_dir: str = ""
    # The most a tool's ``artifacts_max_mb`` may be.
    max_artifacts_mb: int = _bounded("artifacts_max_mb", 1024)

    # Tools built from source (docs/tools.md, "Built tools"): the most a build context may
    # hold, the memory of a build's steps, the characters of its log kept (the tail).
    build_context_max_mb: int = Field(default=16, ge=1, le=1024)
    build_memory_mb: int = Field(default=1024, ge=64)
    build_log_cap_bytes: int = Field(default=65_536, ge=1024)

    # Completion webhooks (runyard.webhooks.delivery): retried with a doubling backoff from base
    # to max for up to retry_hours after the run ended; each attempt has timeout_seconds in all.
    webhook_retry_hours: float = Field(default=24.0, gt=0)
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    webhook_backoff_base_seconds: float = Field(default=5.0, gt=0)
    webhook_backoff_max_seconds: float = Field(default=3600.0, gt=0)
    # A claimed delivery whose process dies is attempted again after this lease.
    webhook_lease_seconds: float = Field(default=60.0, gt=0)
    # Attempts in flight per delivering process; per tenant and per destination (host:port)
    # across all of them together, checked by each claim under its locks
    # (runyard.domain.webhook_fairness): one tenant's backlog or one slow receiver never takes
    # every slot.
    webhook_concurrency: int = Field(default=8, ge=1, le=256)
    webhook_tenant_concurrency: int = Field(default=4, ge=1, le=256)
    webhook_destination_concurrency: int = Field(default=8, ge=1, le=256)
    webhook_poll_seconds: float = Field(default=1.0, gt=0)
    # A destination to which a tenant's last breaker_failures attempts connected and got no
    # answer is not attempted for that tenant for breaker_cooldown_seconds, doubling up to the
    # max after each failed probe (each tenant has its own breaker per destination).
    webhook_breaker_failures: int = Field(default=5, ge=1, le=1000)
    webhook_breaker_cooldown_seconds: float = Field(default=60.0, gt=0, le=86400)
    webhook_breaker_cooldown_max_seconds: float = Field(default=900.0, gt=0, le=86400)
    # Name lookups of deliveries in progress at once per delivering process (a stuck one holds
    # its thread until the system resolver gives up), a tenant's at most its concurrency of
    # them per process; past that, lookups fail at once.
    webhook_resolver_threads: int = Field(default=16, ge=1, le=1024)
    # Distinct callback URLs one batch may name.
    webhook_batch_max_urls: int = Field(default=10, ge=1, le=1000)
    # Only public destinations unless these are set (SSRF): private networks (RFC 1918,
    # CGNAT, ULA), and loopback (tests, development). Link-local never.
    webhook_allow_private: bool = False
    webhook_allow_loopback: bool = False

    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _check_heartbeat(self) -> Settings:
        if self.heartbeat_seconds is not None and self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("RUNYARD_HEARTBEAT_SECONDS must be shorter than RUNYARD_LEASE_SECONDS")
        if self.heartbeat_interval + self.heartbeat_round_timeout >= self.lease_seconds:
            raise ValueError(
                "RUNYARD_HEARTBEAT_SECONDS + RUNYARD_HEARTBEAT_TIMEOUT_SECONDS must be shorter"
                " than RUNYARD_LEASE_SECONDS"
            )
        return self

    @model_validator(mode="after")
    def _check_lock_timeout(self) -> Settings:
        # Postgres would never get to a lock timeout longer than the statement's own.
        if self.db_lock_timeout_seconds > self.db_statement_timeout_seconds:
            raise ValueError(
                "RUNYARD_DB_LOCK_TIMEOUT_SECONDS must not exceed "
                "RUNYARD_DB_STATEMENT_TIMEOUT_SECONDS"
            )
        return self

    @model_validator(mode="after")
    def _check_webhook_lease(self) -> Settings:
        # A delivery still in progress must not be claimed and sent again by another process.
        if self.webhook_lease_seconds <= self.webhook_timeout_seconds:
            raise ValueError(
                "RUNYARD_WEBHOOK_LEASE_SECONDS must be longer than RUNYARD_WEBHOOK_TIMEOUT_SECONDS"
            )
        if self.webhook_breaker_cooldown_max_seconds < self.webhook_breaker_cooldown_seconds:
            raise ValueError(
                "RUNYARD_WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS must not be shorter than "
                "RUNYARD_WEBHOOK_BREAKER_COOLDOWN_SECONDS"
            )
        return self

    @property
    def worker_queue_names(self) -> tuple[str, ...]:
        """``worker_queues`` as names, in order, without repeats."""
        names = (name.strip() for name in self.worker_queues.split(","))
        return tuple(dict.fromkeys(name for name in names if name))

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between lease renewals: the setting, or a third of the lease."""
        return self.heartbeat_seconds or self.lease_seconds / 3

    @property
    def heartbeat_round_timeout(self) -> float:
        """Seconds one heartbeat round may take; a worker also stops acting as owner this long
        before its lease runs out. Default: half the smaller of the interval and the rest of
        the lease after one interval."""
        if self.heartbeat_timeout_seconds is not None:
            return self.heartbeat_timeout_seconds
        interval = self.heartbeat_interval
        return min(interval, self.lease_seconds - interval) / 2

    def connection_plan(self) -> ConnectionPlan:
        """What this process's connections may rely on (``runyard.platform.pooling``)."""
        return connection_plan(
            self.database_pooler,
            self.database_url,
            self.listen_database_url,
            pooler_prepares=self.database_pooler_prepares,
        )

    def sqlalchemy_url(self) -> str:
        """The database URL with the psycopg 3 driver named, as SQLAlchemy wants it."""
        return normalize_database_url(self.database_url)


def normalize_database_url(url: str) -> str:
    """Turn ``postgres://`` / ``postgresql://`` URLs into ``postgresql+psycopg://``."""
    if not url:
        raise ValueError("RUNYARD_DATABASE_URL is not set")
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(database_url: str) -> str:
    """A URL psycopg accepts directly (no SQLAlchemy driver name)."""
    return normalize_database_url(database_url).replace("postgresql+psycopg://", "postgresql://")
