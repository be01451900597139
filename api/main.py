"""The FastAPI app factory: the API process's object graph is built here, at startup."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from sqlalchemy import Engine

import runyard
from api.deps import Services
from api.docs_pages import install_docs, install_front_door
from api.guard import RequestGuard
from api.http_metrics import RequestMetrics
from api.mcp import install_mcp
from api.openapi import OPENAPI_TAGS, install_openapi
from api.problems import install_problem_handlers
from api.routes import artifacts as artifact_routes
from api.routes import (
    batches,
    events,
    health,
    keys,
    run_delete,
    runs,
    sandboxes,
    schedules,
    tools,
    webhooks,
)
from api.routes import builds as builds_routes
from api.routes import metrics as metrics_routes
from api.routes import usage as usage_routes
from api.tracing_middleware import TraceRequests
from api.ui.install import install_ui
from runyard.artifact_store import ArtifactStore
from runyard.artifact_stores.factory import store_from_settings
from runyard.artifacts.reads import ArtifactReads
from runyard.builds.reads import BuildReads
from runyard.builds.setup import with_builds
from runyard.maintenance.chores import Chore, Chores, registry_reload
from runyard.maintenance.retention import retention_seconds
from runyard.maintenance.sweep import Sweeper
from runyard.maintenance.upkeep import Upkeep
from runyard.platform.db import DbTimeouts, make_engine
from runyard.platform.idle_ping import ping_when_idle
from runyard.platform.pooling import connection_plan, log_plan
from runyard.platform.schema_version import MIGRATION_HEADS
from runyard.platform.settings import Settings, libpq_url
from runyard.queue import AdmissionCaps, ApiQueue
from runyard.queue.builds import BuildQueue
from runyard.queue.flow import SubmitRates
from runyard.queue.workers import WorkerRegistry
from runyard.reads.metrics import Metrics, Role
from runyard.reads.notify import RunNotifier
from runyard.reads.runs import RunReader
from runyard.registry.reload import live_registry
from runyard.registry.tools import ToolRegistry, load_registry
from runyard.runner import Runner
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.sandbox_engine import DockerSandboxEngine
from runyard.schedules.store import Schedules
from runyard.submission.batches import Batches
from runyard.submission.quota import DailyQuota
from runyard.submission.runs import Submissions
from runyard.submission.waits import WaitLimits, Waits
from runyard.sync.executor import SyncExecutor
from runyard.usage.ledger import UsageLedger
from runyard.webhooks.delivery import WebhookConfig, WebhookDeliverer

logger = logging.getLogger(__name__)

DESCRIPTION = """\
Run registered tools in hardened containers through a durable queue.

Authenticate with `Authorization: Bearer <api key>` (keys come from
`runyard keys create --tenant T [--admin]`). A key sees only its tenant's runs; another
tenant's run answers 404. Every error is an `application/problem+json` document with a stable
`code` and, where one field is at fault, its name in `field`.
"""


def _listen_url(engine: Engine) -> str:
    """The engine's database as a plain libpq URL, for the LISTEN connection."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


# A pooled connection given back longer ago than this is pinged before use; a hot pool's are
# not (runyard.platform.idle_ping): a ping was a round trip of every request.
IDLE_PING_SECONDS = 5.0


def _api_engine(settings: Settings, timeouts: DbTimeouts) -> Engine:
    """The pool requests share."""
    engine = make_engine(
        settings.database_url,
        pool_size=settings.api_db_pool_size,
        pre_ping=False,
        timeouts=timeouts,
        plan=settings.connection_plan(),
    )
    ping_when_idle(engine, IDLE_PING_SECONDS)
    return engine


def _start_sync_mode(
    settings: Settings,
    queue: ApiQueue,
    runner: Runner | None,
    own_engine: bool,
    timeouts: DbTimeouts,
    artifacts: ArtifactStore,
    metrics: Metrics,
) -> tuple[SyncExecutor, list[Engine], list[Chore]]:
    """Sync mode (``RUNYARD_QUEUE_ENABLED=false``): the inline executor, its lease renewals
    (on a small pool of its own unless the engine was injected), and its chores: adopting the
    sync runs of this engine whose API process is gone, and the sweep."""
    sync_runner = runner if runner is not None else DockerRunner.from_settings(settings)
    engines: list[Engine] = []
    heartbeat_queue = queue
    if own_engine:
        # Like the worker's heartbeats: a pool that requests cannot exhaust.
        heartbeat_engine = make_engine(
            settings.database_url,
            pool_size=1,
            max_overflow=1,
            timeouts=timeouts,
            plan=settings.connection_plan(),
        )
        engines.append(heartbeat_engine)
        heartbeat_queue = ApiQueue(heartbeat_engine)
    sync = SyncExecutor(
        queue,
        sync_runner,
        max_concurrency=settings.sync_max_concurrency,
        lease_seconds=settings.lease_seconds,
        heartbeat_queue=heartbeat_queue,
        registry=WorkerRegistry(queue.engine),
        artifacts=artifacts,
        metrics=metrics,
    )
    sweeper = Sweeper(queue.engine, sync_runner, grace_seconds=settings.sweep_grace_seconds)
    sync.start()
    logger.info(
        "sync mode: tools run inline in the API",
        extra={"max_concurrency": settings.sync_max_concurrency, "worker_id": sync.owner_id},
    )
    return (
        sync,
        engines,
        [
            Chore("sync adoption", settings.reaper_interval_seconds, sync.adopt_once),
            Chore("sweep", settings.sweep_interval_seconds, sweeper.run_once),
        ],
    )


def _start_upkeep(
    settings: Settings,
    queue: ApiQueue,
    own_engine: bool,
    timeouts: DbTimeouts,
    artifacts: ArtifactStore,
    metrics: Metrics,
) -> tuple[Upkeep, list[Engine]]:
    """Sync mode: retention and webhook delivery in this process (no reaper needed for them);
    deliveries on a small pool of their own unless the engine was injected."""
    config = WebhookConfig.from_settings(settings)
    engine = queue.engine
    if own_engine:
        engine = make_engine(
            settings.database_url,
            pool_size=config.concurrency + 1,
            max_overflow=0,
            timeouts=timeouts,
            plan=settings.connection_plan(),
        )
    upkeep = Upkeep(
        queue,
        WebhookDeliverer(engine, config, metrics=metrics),
        retention_seconds=retention_seconds(settings.retention_days),
        batch_size=settings.reaper_batch_size,
        interval_seconds=settings.reaper_interval_seconds,
        artifacts=artifacts,
    )
    upkeep.start()
    return upkeep, [engine] if own_engine else []


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    registry: ToolRegistry | None = None,
    runner: Runner | None = None,
    metrics: Metrics | None = None,
) -> FastAPI:
    """Build the app: routes, request guard, problem handlers, /docs, and /ui when enabled.

    Nothing connects until startup. The lifespan then builds the engine (unless ``engine`` is
    given), the queue, the registry (unless ``registry`` is given) and the LISTEN notifier.
    With ``RUNYARD_QUEUE_ENABLED=false`` it also starts sync mode: the inline executor with
    ``runner`` (else a Docker runner from ``settings``), its renewal thread, the orphan
    settling and sweep chores on a thread of their own, and retention and webhook delivery
    (``runyard.maintenance.upkeep``).

    Its series go to ``metrics`` (``runyard dev`` passes the one its worker and reaper write
    to, so ``/metrics`` shows theirs too), else to a registry of its own.
    """

    # No API statement waits for a run (``?wait`` and SSE sleep on LISTEN between short
    # reads), so the API gets the same statement and lock timeouts as the worker.
    timeouts = DbTimeouts.from_settings(settings)
    app_metrics = (metrics or Metrics()).export(Role.API)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_engine = engine is None
        db = engine if engine is not None else _api_engine(settings, timeouts)
        engines = [db] if own_engine else []
        app_metrics.watch_queue(db)
        chores: list[Chore] = []
        queue = ApiQueue(
            db,
            backoff_base_seconds=settings.retry_backoff_base_seconds,
            backoff_max_seconds=settings.retry_backoff_max_seconds,
        )
        plan = connection_plan(
            settings.database_pooler, _listen_url(db), settings.listen_database_url
        )
        log_plan(logger, plan, settings.events_poll_seconds)
        notifier = RunNotifier(None if plan.listen_url is None else libpq_url(plan.listen_url))
        builds = BuildQueue(db, log_cap=settings.build_log_cap_bytes)
        # A registry handed in stays as it is; the one read from the file follows its edits.
        reload = Chores([])
        given = registry
        if given is None:
            given, watcher = live_registry(
                load_registry(settings.tools_file, settings), settings, process="api"
            )
            reload = registry_reload(watcher, thread_name="runyard-registry-reload")
        tools = with_builds(given, builds, settings)
        caps = AdmissionCaps.from_settings(settings)
        sync: SyncExecutor | None = None
        artifacts = store_from_settings(settings, db)
        if not settings.queue_enabled:
            sync, engines_, chores = _start_sync_mode(
                settings, queue, runner, own_engine, timeouts, artifacts, app_metrics
            )
            engines += engines_
            notifier.add_listener(sync.on_notification)
        limits = WaitLimits(settings.max_wait_seconds, settings.events_poll_seconds)
        quota = DailyQuota(UsageLedger(db), settings.tenant_daily_cpu_seconds)
        batch_uses = Batches(
            queue, tools, caps, queue_mode=sync is None, metrics=app_metrics, quota=quota
        )
        waits = Waits(notifier, RunReader(db), batch_uses, limits)
        services = Services(
            settings=settings,
            engine=db,
            queue=queue,
            registry=tools,
            notifier=notifier,
            caps=caps,
            migration_heads=MIGRATION_HEADS,
            events_limiter=anyio.CapacityLimiter(settings.events_db_concurrency),
            submissions=Submissions(
                queue,
                tools,
                caps,
                waits,
                sync=sync,
                builds=builds,
                metrics=app_metrics,
                quota=quota,
            ),
            batches=batch_uses,
            waits=waits,
            sync=sync,
            artifacts=ArtifactReads(db, artifacts),
            builds=builds,
            build_reads=BuildReads(db),
            metrics=app_metrics,
            schedules=Schedules(db, tools, max_per_tenant=settings.tenant_max_schedules),
            submit_rates=SubmitRates(db, settings.tenant_submit_limit()),
        )
        app.state.services = services
        background = Chores(chores, thread_name="runyard-sync-chores")
        background.start()
        reload.start()
        upkeep: Upkeep | None = None
        if not settings.queue_enabled:
            upkeep, upkeep_engines = _start_upkeep(
                settings, queue, own_engine, timeouts, artifacts, app_metrics
            )
            engines += upkeep_engines
        listening = asyncio.create_task(notifier.run(), name="runyard-listen")
        try:
            yield
        finally:
            listening.cancel()
            await anyio.to_thread.run_sync(reload.stop)
            with contextlib.suppress(asyncio.CancelledError):
                await listening
            await anyio.to_thread.run_sync(background.stop)
            if upkeep is not None:
                await anyio.to_thread.run_sync(upkeep.stop)
            if services.sync is not None:
                await anyio.to_thread.run_sync(services.sync.stop)
            for own in engines:
                own.dispose()

    app = FastAPI(
        title="runyard",
        version=runyard.__version__,
        description=DESCRIPTION,
        openapi_tags=OPENAPI_TAGS,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_problem_handlers(app, db_retry_after_seconds=settings.db_retry_after_seconds)
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_request_bytes,
        max_json_depth=settings.max_json_depth,
        form_path_prefix="/ui/" if settings.ui_enabled else None,
    )
    # Added last, so outermost of ours: it counts the guard's refusals too.
    app.add_middleware(RequestMetrics, metrics=app_metrics)
    app.add_middleware(TraceRequests)
    app.include_router(health.router)
    app.include_router(metrics_routes.router)
    app.include_router(runs.router)
    app.include_router(events.router)
    app.include_router(tools.router)
    app.include_router(builds_routes.router)
    app.include_router(keys.router)
    app.include_router(run_delete.router)
    app.include_router(artifact_routes.router)
    app.include_router(webhooks.router)
    app.include_router(batches.router)
    app.include_router(schedules.router)
    install_mcp(app)
    app.include_router(sandboxes.router)
    # Sandbox files and terminals go from here straight to the engine; connected on the
    # first such request.
    app.state.sandbox_engine = functools.cache(
        lambda: DockerSandboxEngine.from_env(settings.docker_timeout_seconds)
    )
    app.include_router(usage_routes.router)
    if settings.ui_enabled:
        install_ui(app, settings)
    install_openapi(app)
    install_docs(app)
    install_front_door(app, "/ui/" if settings.ui_enabled else "/docs")
    return app
