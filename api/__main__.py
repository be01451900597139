"""``python -m api`` / ``runyard api``: serve the HTTP API with uvicorn."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from api.main import create_app
from runyard.logs import configure
from runyard.settings import Settings


def main(argv: Sequence[str] | None = None) -> int:
    """Serve on ``--host``/``--port`` (defaults from settings: 127.0.0.1:8000)."""
    parser = argparse.ArgumentParser(prog="runyard api", description=__doc__)
    parser.add_argument("--host", help="address to bind (default RUNYARD_API_HOST)")
    parser.add_argument("--port", type=int, help="port (default RUNYARD_API_PORT, 8000)")
    args = parser.parse_args(argv)
    settings = Settings()
    configure(settings.log_level, settings.log_format)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=args.host or settings.api_host,
        port=args.port or settings.api_port,
        log_config=None,
        access_log=False,
        # Open event streams and waits must not hold a rolling restart up for long; sync-mode
        # tools left running are released, and adopted by another API process of the engine.
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
