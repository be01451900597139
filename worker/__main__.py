"""``python -m worker`` / ``runyard worker``: run a worker process."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from sqlalchemy import Engine

from runyard.db import DbTimeouts, make_engine
from runyard.docker_runner import DockerRunner
from runyard.logs import configure
from runyard.metrics import Metrics
from runyard.queue import JobQueue
from runyard.runner import RunnerUnavailable
from runyard.settings import Settings
from runyard.sweep import Sweeper
from runyard.workers import WorkerRegistry, new_worker_id
from worker.service import Worker, WorkerConfig
from worker.wakeup import Wakeups

logger = logging.getLogger("worker")


HEARTBEAT_POOL_SIZE = 2


def worker_engines(
    database_url: str, concurrency: int, timeouts: DbTimeouts | None = None
) -> tuple[Engine, Engine]:
    """The worker's pool (a connection per slot, the claim loop and the sweep) and a small one
    of its own for heartbeats and the worker's row, which the slots can never exhaust: its
    users (the heartbeat thread, start and stop) hold one connection each at most. No
    pre-ping: every database error of the worker is retried."""
    engine = make_engine(
        database_url,
        pool_size=concurrency + 2,
        max_overflow=concurrency,
        pre_ping=False,
        timeouts=timeouts,
    )
    heartbeat_engine = make_engine(
        database_url,
        pool_size=HEARTBEAT_POOL_SIZE,
        max_overflow=0,
        pre_ping=False,
        timeouts=timeouts,
    )
    return engine, heartbeat_engine


def build_worker(settings: Settings, concurrency: int | None = None) -> Worker:
    """Wire a worker from settings: engine, queue, Docker runner, registry."""
    slots = concurrency or settings.worker_concurrency
    engine, heartbeat_engine = worker_engines(
        settings.database_url, slots, DbTimeouts.from_settings(settings)
    )
    runner = DockerRunner.from_settings(settings)
    config = WorkerConfig(
        worker_id=settings.worker_id or new_worker_id(),
        concurrency=slots,
        lease_seconds=settings.lease_seconds,
        heartbeat_seconds=settings.heartbeat_interval,
        poll_seconds=settings.worker_poll_seconds,
        sweep_interval_seconds=settings.sweep_interval_seconds,
        engine_backoff_base_seconds=settings.engine_backoff_base_seconds,
        engine_backoff_max_seconds=settings.engine_backoff_max_seconds,
    )
    queue = JobQueue(
        engine,
        backoff_base_seconds=settings.retry_backoff_base_seconds,
        backoff_max_seconds=settings.retry_backoff_max_seconds,
    )
    sweeper = Sweeper(engine, runner, grace_seconds=settings.sweep_grace_seconds)
    metrics = Metrics()
    if settings.worker_metrics_port:
        metrics.serve(settings.worker_metrics_port, settings.metrics_host)
    return Worker(
        queue,
        runner,
        config,
        WorkerRegistry(heartbeat_engine),
        sweeper,
        JobQueue(heartbeat_engine),
        metrics,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, run until SIGTERM (hand over) or, with ``--once``, one round."""
    parser = argparse.ArgumentParser(prog="runyard worker", description=__doc__)
    parser.add_argument("--once", action="store_true", help="claim once, finish those runs, exit")
    parser.add_argument(
        "--concurrency", type=int, help="slots (default RUNYARD_WORKER_CONCURRENCY)"
    )
    parser.add_argument(
        "--drain", action="store_true", help="on SIGTERM finish the runs in progress instead"
    )
    args = parser.parse_args(argv)
    settings = Settings()
    configure(settings.log_level, settings.log_format)
    try:
        worker = build_worker(settings, args.concurrency)
        worker.start()
    except (RunnerUnavailable, ValueError) as exc:
        logger.error("cannot start: %s", exc)
        return 2
    logger.info("worker started", extra={"worker_id": worker.worker_id})
    if args.once:
        round_ = worker.run_once()
        worker.wait_idle()
        worker.close()
        logger.info(
            "worker --once done", extra={"claimed": round_.claimed, "adopted": round_.adopted}
        )
        return 0

    signals_seen = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signals_seen.is_set():
            logger.warning("second signal: exiting at once")
            sys.exit(1)
        signals_seen.set()
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    wakeups = Wakeups(settings.database_url, worker.notify_job, worker.notify_cancel)
    wakeups.start()
    worker.run_forever()
    wakeups.stop()
    if args.drain:
        logger.info("draining: waiting for runs in progress")
        worker.wait_idle()
        worker.close()
    else:
        released = worker.hand_over()
        logger.info("handed over", extra={"released": released})
    return 0


if __name__ == "__main__":
    sys.exit(main())
