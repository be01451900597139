"""``python -m reaper`` / ``runyard reaper``: run the stale-lease reaper, and deliver
completion webhooks on a thread beside it."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from reaper.service import Reaper, ReaperConfig
from runyard.artifact_stores.factory import store_from_settings
from runyard.maintenance.retention import retention_seconds
from runyard.platform.db import DbTimeouts, make_engine
from runyard.platform.logs import configure
from runyard.platform.pooling import log_plan
from runyard.platform.settings import Settings
from runyard.platform.tracing import set_up
from runyard.queue import JobQueue
from runyard.reads.metrics import Metrics
from runyard.webhooks.delivery import WebhookConfig, WebhookDeliverer

logger = logging.getLogger("reaper")


def build_reaper(settings: Settings, metrics: Metrics | None = None) -> Reaper:
    """Wire a reaper from settings (serving ``metrics`` if a port is set)."""
    engine = make_engine(
        settings.database_url,
        pool_size=2,
        max_overflow=2,
        timeouts=DbTimeouts.from_settings(settings),
        plan=settings.connection_plan(),
    )
    queue = JobQueue(
        engine,
        backoff_base_seconds=settings.retry_backoff_base_seconds,
        backoff_max_seconds=settings.retry_backoff_max_seconds,
    )
    config = ReaperConfig(
        batch_size=settings.reaper_batch_size,
        engine_dead_after_seconds=settings.engine_dead_after_seconds,
        retention_seconds=retention_seconds(settings.retention_days),
        interval_seconds=settings.reaper_interval_seconds,
    )
    metrics = metrics or Metrics()
    if settings.reaper_metrics_port:
        metrics.serve(settings.reaper_metrics_port, settings.metrics_host)
    return Reaper(queue, config, metrics=metrics, artifacts=store_from_settings(settings, engine))


def build_deliverer(settings: Settings, metrics: Metrics | None = None) -> WebhookDeliverer:
    """Wire a webhook deliverer from settings, on a pool of its own (a connection per
    delivery thread, plus the claim's)."""
    config = WebhookConfig.from_settings(settings)
    engine = make_engine(
        settings.database_url,
        pool_size=config.concurrency + 1,
        max_overflow=0,
        timeouts=DbTimeouts.from_settings(settings),
        plan=settings.connection_plan(),
    )
    return WebhookDeliverer(engine, config, metrics=metrics)


def main(argv: Sequence[str] | None = None) -> int:
    """One pass with ``--once``; otherwise a pass every interval until SIGTERM."""
    parser = argparse.ArgumentParser(prog="runyard reaper", description=__doc__)
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    args = parser.parse_args(argv)
    settings = Settings()
    configure(settings.log_level, settings.log_format)
    set_up("runyard-reaper")
    metrics = Metrics()
    try:
        log_plan(logger, settings.connection_plan(), None)
        reaper = build_reaper(settings, metrics)
        deliverer = build_deliverer(settings, metrics)
    except ValueError as exc:
        logger.error("cannot start: %s", exc)
        return 2
    if args.once:
        result = reaper.run_once()
        delivered = deliverer.run_once()
        deliverer.close()
        logger.info("reaper --once done", extra={**result.__dict__, **delivered.__dict__})
        return 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        reaper.stop()
        deliverer.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    webhooks = threading.Thread(target=deliverer.run_forever, name="runyard-webhooks")
    webhooks.start()
    reaper.run_forever()
    deliverer.stop()
    webhooks.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
