"""Liveness and readiness; neither needs an API key."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

from api.deps import ServicesDep
from api.problems import Problem
from api.schemas import HealthOut, ProblemOut
from runyard.schema_version import database_revisions

logger = logging.getLogger(__name__)

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
    """The database answers and its schema is at the head revision of this code."""
    try:
        revisions = database_revisions(services.engine)
    except ProgrammingError:
        revisions = frozenset()
    except (OperationalError, SQLAlchemyTimeoutError) as exc:
        logger.warning("readiness: database unreachable", extra={"error": str(exc)[:300]})
        raise Problem(
            503,
            "database_unavailable",
            "the database is unreachable",
            headers={"Retry-After": str(services.settings.retry_after_seconds)},
        ) from exc
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
