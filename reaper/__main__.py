"""``python -m reaper`` / ``runyard reaper``: run the stale-lease reaper, and beside it on
threads of their own deliver completion webhooks and fire schedules' slots."""

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
from runyard.builds.setup import with_builds
from runyard.maintenance.chores import Chores, registry_reload
from runyard.maintenance.retention import retention_seconds
from runyard.platform.db import DbTimeouts, make_engine
from runyard.platform.logs import configure
from runyard.platform.pooling import log_plan
from runyard.platform.settings import Settings
from runyard.platform.trace_setup import set_up
from runyard.queue import AdmissionCaps, JobQueue
from runyard.queue.builds import BuildQueue
from runyard.reads.metrics import Metrics
from runyard.registry.reload import live_registry
from runyard.registry.tools import RegistryError, load_registry
from runyard.schedules.scheduler import Scheduler, SchedulerConfig, SchedulerResult
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


def build_scheduler(settings: Settings) -> tuple[Scheduler, Chores]:
    """Wire the scheduler from settings, on a small pool of its own, with the tool registry
    (kept current from the tools file by the chores returned, as the API's) that each slot's
    run is checked against."""
    engine = make_engine(
        settings.database_url,
        pool_size=1,
        max_overflow=1,
        timeouts=DbTimeouts.from_settings(settings),
        plan=settings.connection_plan(),
    )
    registry, watcher = live_registry(
        load_registry(settings.tools_file, settings), settings, process="reaper"
    )
    config = SchedulerConfig(
        interval_seconds=settings.scheduler_interval_seconds,
        grace_seconds=settings.scheduler_grace_seconds,
    )
    tools = with_builds(registry, BuildQueue(engine), settings)
    scheduler = Scheduler(engine, tools, AdmissionCaps.from_settings(settings), config)
    return scheduler, registry_reload(watcher, thread_name="runyard-registry-reload")


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
        scheduling = build_scheduler(settings) if settings.scheduler_interval_seconds else None
    except (ValueError, RegistryError) as exc:
        logger.error("cannot start: %s", exc)
        return 2
    if args.once:
        result = reaper.run_once()
        delivered = deliverer.run_once()
        deliverer.close()
        scheduled = scheduling[0].run_once() if scheduling else SchedulerResult()
        done = {**result.__dict__, **delivered.__dict__, **scheduled.__dict__}
        logger.info("reaper --once done", extra=done)
        return 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        reaper.stop()
        deliverer.stop()
        if scheduling:
            scheduling[0].stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threads = [threading.Thread(target=deliverer.run_forever, name="runyard-webhooks")]
    if scheduling:
        threads.append(threading.Thread(target=scheduling[0].run_forever, name="runyard-schedules"))
        scheduling[1].start()
    for thread in threads:
        thread.start()
    reaper.run_forever()
    deliverer.stop()
    if scheduling:
        scheduling[0].stop()
        scheduling[1].stop()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
