"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import ServicesDep
from api.problems import Problem

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(services: ServicesDep) -> dict[str, str]:
    """The database answers and is migrated."""
    try:
        with services.engine.connect() as conn:
            conn.execute(text("SELECT 1 FROM tool_runs LIMIT 0"))
    except Exception as exc:
        raise Problem(503, "not_ready", "the database is unreachable or not migrated") from exc
    return {"status": "ready"}
