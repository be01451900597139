"""``python -m api`` / ``runyard api``: serve the HTTP API with uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from api.main import create_app
from api.serving import QuietServer
from runyard.platform.heap import settle_heap
from runyard.platform.logs import configure
from runyard.platform.settings import Settings
from runyard.platform.trace_setup import set_up

logger = logging.getLogger(__name__)

# Open event streams and waits must not hold a rolling restart up for long; sync-mode tools
# left running are released, and adopted by another API process of the engine.
GRACEFUL_SHUTDOWN_SECONDS = 10


def frozen(app: FastAPI) -> FastAPI:
    """``app``, with every object made so far (the modules, the app and its routes and
    schemas: some 200,000) moved out of the garbage collector's sight. They live as long as
    the process, and each full collection walked them all: about half the CPU of a batch of
    1,000 runs went to collections."""
    settle_heap()
    return app


def app_from_env() -> FastAPI:
    """The app of one worker process, from the environment (uvicorn's factory)."""
    settings = Settings()
    configure(settings.log_level, settings.log_format)
    set_up("runyard-api")
    return frozen(create_app(settings))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve on ``--host``/``--port`` (defaults from settings: 127.0.0.1:8000)."""
    parser = argparse.ArgumentParser(prog="runyard api", description=__doc__)
    parser.add_argument("--host", help="address to bind (default RUNYARD_API_HOST)")
    parser.add_argument("--port", type=int, help="port (default RUNYARD_API_PORT, 8000)")
    parser.add_argument(
        "--workers", type=int, help="API processes on the port (default RUNYARD_API_WORKERS, 1)"
    )
    args = parser.parse_args(argv)
    settings = Settings()
    configure(settings.log_level, settings.log_format)
    if not settings.database_url:
        # Found here, not in the app's startup: one line instead of the lifespan's traceback.
        logger.error("cannot start: RUNYARD_DATABASE_URL is not set")
        return 2
    workers = args.workers or settings.api_workers
    if workers < 1:
        parser.error("--workers must be 1 or more")
    host = args.host or settings.api_host
    port = args.port or settings.api_port
    served: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_SECONDS,
    }
    if workers == 1:
        traced = set_up("runyard-api")
        server = QuietServer(uvicorn.Config(frozen(create_app(settings)), **served))
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        traced.shutdown()
        # As uvicorn.run: a server that never started (a port in use, a failed startup).
        return 0 if server.started else STARTUP_FAILURE
    # Each process runs uvicorn's own server (its supervisor makes them): the tick of ten
    # wake-ups a second stays there.
    if not settings.queue_enabled:
        parser.error("sync mode (RUNYARD_QUEUE_ENABLED=false) serves from one API process")
    if settings.ui_session_secret is None:
        # The processes must accept each other's dashboard sessions: one secret for all.
        os.environ["RUNYARD_UI_SESSION_SECRET"] = secrets.token_hex(32)
        logger.info("no RUNYARD_UI_SESSION_SECRET: the workers share one made for this run")
    uvicorn.run("api.__main__:app_from_env", factory=True, workers=workers, **served)
    return 0


if __name__ == "__main__":
    sys.exit(main())
