"""Typed dependencies: the services built by the app factory, and the caller's identity."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from api.problems import Problem
from runyard.artifacts.reads import ArtifactReads
from runyard.builds.reads import BuildReads
from runyard.platform.settings import Settings
from runyard.queue import AdmissionCaps, ApiQueue
from runyard.queue.builds import BuildQueue
from runyard.queue.flow import SubmitRates
from runyard.reads.metrics import Metrics
from runyard.reads.notify import RunNotifier
from runyard.registry.tools import ToolRegistry
from runyard.schedules.store import Schedules
from runyard.submission.batches import Batches
from runyard.submission.runs import Submissions
from runyard.submission.waits import Waits
from runyard.sync.executor import SyncExecutor
from runyard.tenancy.auth import Principal, PrincipalCache, authenticate

DEV_TENANT = "dev"
HEALTH_THREADS = 2


@dataclass
class Services:
    """Everything a request may need, built once per app."""

    settings: Settings
    engine: Engine
    queue: ApiQueue
    registry: ToolRegistry
    notifier: RunNotifier
    caps: AdmissionCaps
    migration_heads: frozenset[str]
    # Database reads of the event streams share these few tokens: streams never hold a
    # connection while they wait, and together they never take more than this many.
    events_limiter: anyio.CapacityLimiter
    # The submit use case (runyard.submission.runs), in either mode.
    submissions: Submissions
    # Batches (runyard.submission.batches): queue mode only.
    batches: Batches
    # Waiting for a run or a batch to end (``?wait=``), for the submit and the reads alike.
    waits: Waits
    # The read side of runs' artifacts (its ``store`` is the one writers use).
    artifacts: ArtifactReads
    # Builds of the tools built from source: their transitions and their reads.
    builds: BuildQueue
    build_reads: BuildReads
    # The series /metrics serves: this process's (and in ``runyard dev`` the worker's and the
    # reaper's), with the queue gauges.
    metrics: Metrics
    # Recurring schedules (runyard.schedules): a tenant's records; the reaper fires them.
    schedules: Schedules
    # Each tenant's submit bucket (RUNYARD_TENANT_SUBMITS_PER_SECOND; none: no rate).
    submit_rates: SubmitRates
    # Sync mode only: the inline executor, whose slots have threads of their own.
    sync: SyncExecutor | None = None
    open_streams: int = 0
    # Verified API keys, trusted for a few seconds (runyard.tenancy.auth.AUTH_CACHE_SECONDS).
    auth_cache: PrincipalCache = field(default_factory=PrincipalCache)
    # Readiness reads the database on these few threads, never the pool requests share
    # (api.routes.health).
    health_limiter: anyio.CapacityLimiter = field(
        default_factory=lambda: anyio.CapacityLimiter(HEALTH_THREADS)
    )


# Dependencies are ``async`` where they do no I/O: FastAPI runs a plain ``def`` dependency in
# the thread pool, one thread hand-off per request each.
async def get_services(request: Request) -> Services:
    """The services of the running app."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="An API key from `runyard keys create --tenant T`",
)


async def get_principal(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Authenticate the Bearer key; with auth disabled everyone is the admin of ``dev``.

    A key verified in the last few seconds is taken from the cache without a thread hop or a
    database read; otherwise the lookup runs in the thread pool.
    """
    key = credentials.credentials.strip() if credentials is not None else ""
    return await principal_of_key(services, key)


async def principal_of_key(services: Services, key: str) -> Principal:
    """Who ``key`` acts for (``get_principal``'s rule, also for WebSockets); 401 problems."""
    if services.settings.auth_disabled:
        return Principal(tenant=DEV_TENANT, admin=True)
    if not key:
        raise Problem(
            401,
            "unauthenticated",
            "send an API key as 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = services.auth_cache.get(key)
    if principal is None:
        principal = await run_in_threadpool(authenticate, services.engine, key)
        if principal is not None:
            services.auth_cache.put(key, principal)
    if principal is None:
        raise Problem(
            401,
            "invalid_api_key",
            "the API key is unknown or revoked",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def visible_tenant(principal: Principal) -> str | None:
    """The tenant whose runs the caller may see; None for an admin (every tenant)."""
    return None if principal.admin else principal.tenant
