"""The FastAPI app factory; the object graph is built here and in the CLI, nowhere else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine

import runyard
from api.deps import Services
from api.problems import install_problem_handlers
from api.routes import health, runs, tools
from runyard.db import make_engine
from runyard.queue import JobQueue
from runyard.settings import Settings
from runyard.tools import ToolRegistry, load_registry


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    registry: ToolRegistry | None = None,
) -> FastAPI:
    """Build the app; ``engine`` and ``registry`` may be injected by tests."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_engine = engine is None
        db = engine if engine is not None else make_engine(settings.database_url, pool_size=10)
        app.state.services = Services(
            settings=settings,
            engine=db,
            queue=JobQueue(
                db,
                backoff_base_seconds=settings.retry_backoff_base_seconds,
                backoff_max_seconds=settings.retry_backoff_max_seconds,
            ),
            registry=registry or load_registry(settings.tools_file, settings),
        )
        try:
            yield
        finally:
            if own_engine:
                db.dispose()

    app = FastAPI(
        title="runyard",
        version=runyard.__version__,
        description="Run registered tools in hardened containers through a durable queue.",
        lifespan=lifespan,
    )
    install_problem_handlers(app)
    app.include_router(health.router)
    app.include_router(runs.router)
    app.include_router(tools.router)
    return app
