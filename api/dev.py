"""``runyard dev``: API, worker and reaper in one process for a laptop.

It uses ``RUNYARD_DATABASE_URL`` when set, else an embedded Postgres under ``./var/pg``.
Auth is switched off and the banner says so.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import uvicorn

from api.main import create_app
from api.serving import QuietServer
from reaper.__main__ import build_deliverer, build_reaper, build_scheduler
from runyard.platform.db import migrate
from runyard.platform.logs import configure
from runyard.platform.settings import Settings
from runyard.platform.trace_setup import set_up
from runyard.reads.metrics import Metrics
from worker.__main__ import build_worker
from worker.wakeup import Wakeups

logger = logging.getLogger("runyard.dev")


def start_embedded_postgres(data_dir: Path) -> tuple[str, Callable[[], None]]:
    """Start (or reuse) a pgserver Postgres in ``data_dir``: its URL and how to stop it."""
    from pgserver.postgres_server import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    server = get_server(data_dir, cleanup_mode="stop")
    return str(server.get_uri()), server.cleanup


def masked_database_url(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``; a URL it cannot parse: as is."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def banner_text(url: str, database_url: str, database_source: str, details: Sequence[str]) -> str:
    """What ``runyard dev`` prints once it is up: where everything is, then ``details``."""
    lines = [
        f"runyard dev is up at {url}",
        f"  API:       {url}/v1/",
        f"  dashboard: {url}/ui/",
        f"  API docs:  {url}/docs",
        f"  database:  {masked_database_url(database_url)} ({database_source})",
        *(f"  {detail}" for detail in details),
    ]
    return "\n" + "\n".join(lines) + "\n"


def _stop_like_ctrl_c(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Bring everything up; Ctrl-C stops it."""
    parser = argparse.ArgumentParser(prog="runyard dev", description=__doc__)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--data-dir", default="var/pg", help="embedded Postgres data directory")
    args = parser.parse_args(argv)

    os.environ["RUNYARD_AUTH_DISABLED"] = "true"
    # A developer's webhook receiver is on this machine; a deployment opens loopback itself.
    os.environ.setdefault("RUNYARD_WEBHOOK_ALLOW_LOOPBACK", "true")
    stop_postgres: Callable[[], None] = lambda: None  # noqa: E731
    database_source = "RUNYARD_DATABASE_URL"
    if not os.environ.get("RUNYARD_DATABASE_URL"):
        data_dir = Path(args.data_dir).resolve()
        url, stop_postgres = start_embedded_postgres(data_dir)
        os.environ["RUNYARD_DATABASE_URL"] = url
        database_source = f"embedded, data in {data_dir}"
    settings = Settings()
    configure(settings.log_level, settings.log_format)
    set_up("runyard-dev")
    migrate(settings.database_url)

    # One registry for the three: the API's /metrics serves the worker's and reaper's series.
    metrics = Metrics()
    worker = build_worker(settings, metrics=metrics)
    reaper = build_reaper(settings, metrics)
    deliverer = build_deliverer(settings, metrics)
    scheduler, registry_reload = build_scheduler(settings)
    plan = settings.connection_plan()
    wakeups = Wakeups(
        plan.listen_url,
        worker.notify_job,
        worker.notify_cancel,
        on_held=worker.notify_held,
        on_build=worker.notify_build,
        on_listening=worker.notify_listening,
    )
    wakeups.start()
    threading.Thread(target=worker.run_forever, name="dev-worker", daemon=True).start()
    threading.Thread(target=reaper.run_forever, name="dev-reaper", daemon=True).start()
    threading.Thread(target=deliverer.run_forever, name="dev-webhooks", daemon=True).start()
    threading.Thread(target=scheduler.run_forever, name="dev-schedules", daemon=True).start()
    registry_reload.start()

    host = args.host or settings.api_host
    port = args.port or settings.api_port
    url = f"http://{host}:{port}"
    banner = banner_text(
        url,
        settings.database_url,
        database_source,
        [
            "auth is OFF (RUNYARD_AUTH_DISABLED=true): do not expose this port",
            f"webhooks may go to loopback: {settings.webhook_allow_loopback} "
            "(RUNYARD_WEBHOOK_ALLOW_LOOPBACK)",
            f"inputs: {worker.inputs} (RUNYARD_HOST_WORKDIR_ROOT={settings.host_workdir_root})",
            f"try: curl -s -X POST {url}/v1/runs -H 'content-type: application/json' "
            '-d \'{"tool":"echo","input":{"hello":"world"}}\'',
        ],
    )
    server = QuietServer(
        uvicorn.Config(
            create_app(settings, metrics=metrics),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
        )
    )

    def announce() -> None:
        # Once the port answers: a reader who waits for the banner can use the stack at once.
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            print(banner, flush=True)  # noqa: T201

    threading.Thread(target=announce, name="dev-banner", daemon=True).start()
    # Once it has shut down, uvicorn raises again the signal it caught: SIGTERM's default
    # action would end the process before the cleanup below (the embedded Postgres was left
    # running). As Ctrl-C, it unwinds through it.
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    try:
        server.run()
    finally:
        wakeups.stop()
        worker.hand_over()
        reaper.stop()
        deliverer.stop()
        scheduler.stop()
        registry_reload.stop()
        stop_postgres()
    return 0


if __name__ == "__main__":
    sys.exit(main())
