"""``python -m worker`` / ``runyard worker``: run a worker process."""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import math
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from sqlalchemy import Engine

from runyard.artifact_stores.factory import store_from_settings
from runyard.builder import BuilderUnavailable
from runyard.builders.docker import DockerBuilder
from runyard.maintenance.chores import Chore, Chores
from runyard.maintenance.sweep import Sweeper
from runyard.platform.db import DbTimeouts, make_engine
from runyard.platform.heap import settle_heap
from runyard.platform.logs import configure
from runyard.platform.pooling import ConnectionPlan, log_plan
from runyard.platform.settings import Settings
from runyard.platform.trace_setup import set_up
from runyard.queue import JobQueue
from runyard.queue.builds import BuildQueue
from runyard.queue.flow import (
    GATE_HEARD_REST_SECONDS,
    GATE_INTERVAL_SECONDS,
    GATE_REST_SECONDS,
    FlowGate,
)
from runyard.queue.workers import WorkerRegistry, new_worker_id
from runyard.reads.metrics import Metrics
from runyard.registry.reload import RegistryChanges, RegistryWatcher
from runyard.registry.tools import RegistryError, ToolRegistry, load_registry
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.sandbox_engine import DockerSandboxEngine
from runyard.runners.docker.usage_meter import UsageMeter
from runyard.sandboxes.body import SandboxRunner
from runyard.sandboxes.store import SandboxStore
from runyard.sandboxes.wakeups import ExecWakeups
from runyard.usage.ledger import UsageLedger
from worker.builds import BuildAgent, BuildConfig
from worker.service import Worker, WorkerConfig
from worker.wakeup import Wakeups

logger = logging.getLogger("worker")


HEARTBEAT_POOL_SIZE = 2
# The build round (three statements) runs at most this often, not at every wake-up: under a
# stream of submits the claim loop wakes for each run, and builds take seconds anyway.
BUILD_ROUND_SECONDS = 1.0
# The same, after a round found nothing to build, while the worker's LISTEN link is up: every
# job that waits for a build is written with its notification (``Worker.notify_build``).
BUILD_HEARD_REST_SECONDS = 10.0


def heartbeat_timeouts(timeouts: DbTimeouts, round_timeout: float | None) -> DbTimeouts:
    """The heartbeat pool's: statements and lock waits bounded by one heartbeat round, and a
    connect no longer than that needs (libpq waits 2 s at least)."""
    if round_timeout is None:
        return timeouts
    lock = timeouts.lock_seconds
    return dataclasses.replace(
        timeouts,
        connect_seconds=min(timeouts.connect_seconds, max(2, math.ceil(round_timeout))),
        statement_seconds=round_timeout,
        lock_seconds=round_timeout if lock is None else min(lock, round_timeout),
    )


def worker_engines(
    database_url: str,
    concurrency: int,
    timeouts: DbTimeouts | None = None,
    *,
    heartbeat_timeout: float | None = None,
    plan: ConnectionPlan | None = None,
) -> tuple[Engine, Engine]:
    """The worker's pool (a connection per slot, the claim loop and the sweep) and a small one
    of its own for heartbeats, releases of handed-over runs and the worker's row, which the
    slots can never exhaust: its users (the heartbeat rounds, the releases, start and stop)
    hold one connection each at most, and its statements are bounded by
    ``heartbeat_timeout``. No pre-ping: every passing database error of the worker is
    retried. Both keep the generic plans of their prepared statements: a claim planned
    afresh at each run costs more than it does (decision 0037)."""
    engine = make_engine(
        database_url,
        pool_size=concurrency + 2,
        max_overflow=concurrency,
        pre_ping=False,
        timeouts=timeouts,
        plan=plan,
        generic_plans=True,
    )
    heartbeat_engine = make_engine(
        database_url,
        pool_size=HEARTBEAT_POOL_SIZE,
        max_overflow=0,
        pre_ping=False,
        timeouts=heartbeat_timeouts(timeouts or DbTimeouts(), heartbeat_timeout),
        plan=plan,
        generic_plans=True,
    )
    return engine, heartbeat_engine


def check_engine(settings: Settings, runner: DockerRunner) -> ToolRegistry:
    """Refuse to start on an engine that lacks a runtime or network a tool names; the
    registry checked."""
    registry = load_registry(settings.tools_file, settings)
    problems = runner.engine_problems(list(registry.tools.values()))
    if problems:
        raise ValueError(
            f"the Docker engine cannot run every tool of {settings.tools_file}:\n  "
            + "\n  ".join(problems)
        )
    return registry


def registry_watch(
    settings: Settings,
    runner: DockerRunner,
    registry: ToolRegistry,
    gate: FlowGate | None = None,
) -> Chores:
    """The worker's chores. The tools file's reload: a worker runs each run from the
    definition stored on it, so a new registry only has its networks and runtimes checked
    against this engine, and what this engine lacks is logged (such runs end
    ``engine_unsupported`` here); its flow limits replace the gate's. The flow gate's passes,
    beside the claims: the runs it releases wake the workers of their queues."""
    limits = [registry.flow_config()]

    def recheck(new: ToolRegistry, changes: RegistryChanges) -> None:
        limits[0] = dataclasses.replace(new, tenant_flow=settings.tenant_flow_limit()).flow_config()
        touched = [new.tools[name] for name in sorted((*changes.added, *changes.changed))]
        problems = runner.engine_problems(touched)
        if problems:
            logger.warning(
                "the Docker engine cannot run every tool of %s: %s",
                settings.tools_file,
                "; ".join(problems),
                extra={"tools_file": str(settings.tools_file), "problems": problems},
            )

    watcher = RegistryWatcher(
        settings.tools_file,
        settings,
        recheck,
        current=registry.tools,
        interval_seconds=settings.tools_reload_seconds,
        process="worker",
    )
    chores = []
    if watcher.interval_seconds > 0:
        chores.append(Chore("tool registry reload", watcher.interval_seconds, watcher.check))
    if gate is not None:
        gate.follow(lambda: limits[0])
        # Resting, the gate is not called ten times a second for nothing: a held job's
        # notification pokes the chores (``Worker.notify_held``).
        chores.append(
            Chore("flow gate", GATE_INTERVAL_SECONDS, gate.release, quiet_for=gate.quiet_for)
        )
    return Chores(chores, thread_name="runyard-worker-chores")


def build_worker(
    settings: Settings, concurrency: int | None = None, metrics: Metrics | None = None
) -> Worker:
    """Wire a worker from settings: engine, queue, Docker runner, registry; its series go to
    ``metrics`` (``runyard dev`` shares one) and are served on the worker's metrics port."""
    slots = concurrency or settings.worker_concurrency
    engine, heartbeat_engine = worker_engines(
        settings.database_url,
        slots,
        DbTimeouts.from_settings(settings),
        heartbeat_timeout=settings.heartbeat_round_timeout,
        plan=settings.connection_plan(),
    )
    runner = DockerRunner.from_settings(settings)
    registry = check_engine(settings, runner)
    config = WorkerConfig(
        worker_id=settings.worker_id or new_worker_id(),
        concurrency=slots,
        queues=settings.worker_queue_names,
        lease_seconds=settings.lease_seconds,
        heartbeat_seconds=settings.heartbeat_interval,
        poll_seconds=settings.worker_poll_seconds,
        sweep_interval_seconds=settings.sweep_interval_seconds,
        heartbeat_timeout_seconds=settings.heartbeat_round_timeout,
        statement_timeout_seconds=settings.db_statement_timeout_seconds,
        engine_backoff_base_seconds=settings.engine_backoff_base_seconds,
        engine_backoff_max_seconds=settings.engine_backoff_max_seconds,
        inputs=runner.input_mode,
    )
    queue = JobQueue(
        engine,
        backoff_base_seconds=settings.retry_backoff_base_seconds,
        backoff_max_seconds=settings.retry_backoff_max_seconds,
    )
    sweeper = Sweeper(engine, runner, grace_seconds=settings.sweep_grace_seconds)
    metrics = metrics or Metrics()
    if settings.worker_metrics_port:
        metrics.serve(settings.worker_metrics_port, settings.metrics_host)
    heartbeat_queue = JobQueue(heartbeat_engine)
    # Rests while no job is held anywhere; a held job's notification wakes it (Wakeups).
    gate = FlowGate(
        engine,
        registry.flow_config,
        rest_seconds=GATE_REST_SECONDS,
        heard_rest_seconds=GATE_HEARD_REST_SECONDS,
    )
    builds = BuildAgent(
        BuildQueue(engine, log_cap=settings.build_log_cap_bytes),
        DockerBuilder.from_env(
            timeout_seconds=settings.docker_timeout_seconds,
            memory_mb=settings.build_memory_mb,
            # The builds' steps are metered as attempts are: under a parent cgroup of each.
            meter=UsageMeter,
        ),
        BuildConfig(
            worker_id=config.worker_id,
            queues=config.queues,
            lease_seconds=settings.lease_seconds,
            heartbeat_seconds=settings.heartbeat_interval,
            min_round_seconds=BUILD_ROUND_SECONDS,
            heard_rest_seconds=BUILD_HEARD_REST_SECONDS,
        ),
        UsageLedger(engine),
    )
    # The worker's row is renewed in the heartbeat round: on the heartbeat's connection, so a
    # busy pool cannot hold a round up.
    return Worker(
        queue,
        # Sandboxes are runs whose attempt also serves commands (runyard.sandboxes.body).
        SandboxRunner(
            runner,
            DockerSandboxEngine.from_env(settings.docker_timeout_seconds),
            SandboxStore(engine),
            wakeups=ExecWakeups(settings.connection_plan().listen_url),
        ),
        config,
        WorkerRegistry(heartbeat_engine),
        sweeper,
        heartbeat_queue,
        metrics,
        artifacts=store_from_settings(settings, engine),
        builds=builds,
        chores=registry_watch(settings, runner, registry, gate),
        flow_gate=gate,
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
    traced = set_up("runyard-worker")
    # `kill -USR1 <pid>` prints every thread's stack to stderr: what a stuck worker waits on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        worker = build_worker(settings, args.concurrency)
        worker.start()
    except (RunnerUnavailable, BuilderUnavailable, ValueError, RegistryError) as exc:
        logger.error("cannot start: %s", exc)
        return 2
    logger.info("worker started", extra={"worker_id": worker.worker_id, "inputs": worker.inputs})
    if args.once:
        round_ = worker.run_once()
        worker.wait_idle()
        worker.close()
        logger.info(
            "worker --once done", extra={"claimed": round_.claimed, "adopted": round_.adopted}
        )
        traced.shutdown()
        return 0
    # Some 90,000 objects startup made, walked by every full collection (up to 58 ms with every
    # thread paused, about once a minute at five runs a second): out of its sight.
    settle_heap()

    signals_seen = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signals_seen.is_set():
            logger.warning("second signal: exiting at once")
            sys.exit(1)
        signals_seen.set()
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    plan = settings.connection_plan()
    log_plan(logger, plan, settings.worker_poll_seconds)
    wakeups = Wakeups(
        plan.listen_url,
        worker.notify_job,
        worker.notify_cancel,
        on_held=worker.notify_held,
        on_build=worker.notify_build,
        on_listening=worker.notify_listening,
    )
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
    traced.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
