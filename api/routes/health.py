"""Liveness and readiness; neither needs an API key."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy.exc import ProgrammingError

from api.deps import ServicesDep
from api.problems import Problem
from api.schemas import HealthOut, ProblemOut
from runyard.schema_version import database_revisions

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> HealthOut:
    """The process answers (it does not look at the database)."""
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    responses={503: {"model": ProblemOut, "description": "Database down or not migrated"}},
)
def readyz(services: ServicesDep) -> HealthOut:
    """The database answers and its schema is at the head revision of this code.

    A database that does not answer is the app's ``database_unavailable`` 503.
    """
    try:
        revisions = database_revisions(services.engine)
    except ProgrammingError:
        revisions = frozenset()
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
