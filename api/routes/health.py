"""Liveness and readiness; neither needs an API key, and neither waits behind requests.

Both are ``async``: a plain ``def`` route runs on the thread pool every request shares, so a
burst of slow requests would keep a probe waiting and get a healthy process restarted.
Readiness reads the database on threads of its own (``Services.health_limiter``) and gives up
after ``READY_TIMEOUT_SECONDS``, answering 503 rather than hanging.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter
from sqlalchemy.exc import ProgrammingError

from api.deps import Services, ServicesDep
from api.problems import Problem
from api.schemas import HealthOut, ProblemOut
from runyard.platform.schema_version import database_revisions

router = APIRouter(tags=["health"])

# Long enough for a healthy database under load, short enough for a probe's own timeout.
READY_TIMEOUT_SECONDS = 3.0


@router.get("/healthz", operation_id="checkLiveness")
async def healthz() -> HealthOut:
    """The process answers (it does not look at the database)."""
    return HealthOut(status="ok")


async def _revisions(services: Services) -> frozenset[str]:
    """The database's revisions, read within ``READY_TIMEOUT_SECONDS``."""

    def read() -> frozenset[str]:
        try:
            return database_revisions(services.engine)
        except ProgrammingError:
            return frozenset()

    with anyio.move_on_after(READY_TIMEOUT_SECONDS):
        # A read that outlives the timeout keeps its thread (and token) until it ends: the
        # limiter bounds how many can, and a probe finding none free times out like this.
        return await anyio.to_thread.run_sync(
            read, limiter=services.health_limiter, abandon_on_cancel=True
        )
    raise Problem(
        503,
        "database_unavailable",
        f"the database did not answer within {READY_TIMEOUT_SECONDS:g} s",
        headers={"Retry-After": str(services.settings.db_retry_after_seconds)},
    )


@router.get(
    "/readyz",
    operation_id="checkReadiness",
    responses={503: {"model": ProblemOut, "description": "Database down or not migrated"}},
)
async def readyz(services: ServicesDep) -> HealthOut:
    """The database answers and its schema is at the head revision of this code.

    A database that does not answer is the app's ``database_unavailable`` 503.
    """
    revisions = await _revisions(services)
    if revisions != services.migration_heads:
        raise Problem(
            503,
            "migrations_pending",
            "the database schema is not at this version's head revision; run `runyard migrate`",
            headers={"Retry-After": str(services.settings.retry_after_seconds)},
            revision=",".join(sorted(revisions)) or None,
            expected=",".join(sorted(services.migration_heads)),
        )
    return HealthOut(status="ready", revision=",".join(sorted(revisions)))
