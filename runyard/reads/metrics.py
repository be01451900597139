"""Prometheus metrics: one registry per process, plus database-derived gauges at scrape time."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, text

from runyard.queue.values import SYNC_QUEUE
from runyard.reads.pools import live_workers_by_queue
from runyard.reads.runs import WORKER_LIVE_SECONDS

logger = logging.getLogger(__name__)

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

QUEUE_GAUGES = text(
    """
    SELECT CAST(status AS text) AS status, queue, count(*) AS n,
           coalesce(extract(epoch FROM now() - min(available_at)
                    FILTER (WHERE status = 'queued' AND available_at <= now())), 0) AS oldest
    FROM tool_run_jobs
    WHERE status IN ('queued', 'running')
    GROUP BY status, queue
    """
)


class QueueCollector(Collector):
    """Queue depth by status and queue, and the age of the oldest due job: one indexed query
    per scrape, so the gauges are true whichever process serves them."""

    def __init__(self, engine: Engine, *, worker_live_seconds: float = WORKER_LIVE_SECONDS) -> None:
        self._engine = engine
        self._live = worker_live_seconds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Read the gauges now."""
        depth = GaugeMetricFamily(
            "runyard_queue_depth", "Jobs by status and queue", labels=["status", "queue"]
        )
        oldest = GaugeMetricFamily(
            "runyard_queue_oldest_due_seconds", "Age of the oldest due queued job", labels=["queue"]
        )
        workers = GaugeMetricFamily(
            "runyard_queue_live_workers", "Live workers that serve the queue", labels=["queue"]
        )
        try:
            with self._engine.connect() as conn:
                rows = conn.execute(QUEUE_GAUGES).all()
                live = live_workers_by_queue(conn, self._live)
        except Exception:
            logger.warning("queue gauges unavailable", exc_info=True)
            rows, live = [], {}
        for queue in sorted({*live, *(r.queue for r in rows)} - {SYNC_QUEUE}):
            workers.add_metric([queue], float(live.get(queue, 0)))
        for status in ("queued", "running"):
            if not any(r.status == status for r in rows):
                depth.add_metric([status, "default"], 0)
        for row in rows:
            depth.add_metric([row.status, row.queue], float(row.n))
            if row.status == "queued":
                oldest.add_metric([row.queue], float(row.oldest))
        yield depth
        yield oldest
        yield workers


@dataclass
class Metrics:
    """Every series a runyard process may export, in a registry of its own."""

    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )

    def __post_init__(self) -> None:
        r = self.registry
        self.claims = Counter("runyard_claims", "Jobs claimed (new attempts)", registry=r)
        self.adoptions = Counter(
            "runyard_adoptions", "Adoptions by outcome", ["outcome"], registry=r
        )
        self.outcomes = Counter(
            "runyard_runs_finished",
            "Runs finalized, by status and error code",
            ["status", "error_code"],
            registry=r,
        )
        self.attempts = Histogram(
            "runyard_run_attempts", "Attempts a run took", buckets=(1, 2, 3, 5, 10), registry=r
        )
        self.wait_time = Histogram(
            "runyard_job_wait_seconds",
            "Requested to started",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "runyard_run_duration_seconds",
            "Started to finished",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.leases_lost = Counter("runyard_leases_lost", "Leases found taken away", registry=r)
        self.heartbeat_failures = Counter(
            "runyard_worker_heartbeat_failures",
            "Heartbeat rounds that did not complete in time",
            registry=r,
        )
        self.handovers = Counter(
            "runyard_worker_handovers",
            "Times the worker handed its runs over because leases could not be renewed",
            registry=r,
        )
        self.claiming = Gauge(
            "runyard_worker_claiming", "1 while the worker claims, 0 while paused", registry=r
        )
        self.claiming.set(1)
        self.loop_errors = Counter(
            "runyard_worker_loop_errors",
            "Unexpected errors caught by the worker's loops, by loop",
            ["loop"],
            registry=r,
        )
        self.connections_cut = Counter(
            "runyard_worker_db_connections_cut",
            "Database connections cut after their peer stopped answering",
            registry=r,
        )
        self.unstorable_outcomes = Counter(
            "runyard_worker_unstorable_outcomes",
            "Outcomes the database refused, stored as internal_error instead",
            registry=r,
        )
        self.db_clock_offset = Gauge(
            "runyard_worker_db_clock_offset_seconds",
            "Database clock minus this host's clock, as the heartbeat measures it",
            registry=r,
        )
        self.requeues = Counter(
            "runyard_requeues", "Attempts put back, by reason", ["reason"], registry=r
        )
        self.slots_busy = Gauge("runyard_worker_slots_busy", "Slots running an attempt", registry=r)
        self.slots_total = Gauge("runyard_worker_slots", "Slots of this worker", registry=r)
        self.engine_up = Gauge(
            "runyard_worker_engine_up", "1 while this worker's engine answers", registry=r
        )
        self.engine_probe_failures = Counter(
            "runyard_worker_engine_probe_failures", "Engine probes that got no answer", registry=r
        )
        self.reaper_actions = Counter(
            "runyard_reaper_actions", "What the reaper did", ["action"], registry=r
        )
        self.webhook_attempts = Counter(
            "runyard_webhook_attempts",
            "Webhook delivery attempts, by outcome (delivered, retrying, gave_up)",
            ["outcome"],
            registry=r,
        )
        self.submissions = Counter(
            "runyard_api_submissions", "Runs submitted, by result", ["result"], registry=r
        )

    def watch_queue(self, engine: Engine) -> None:
        """Also export the database-derived queue gauges."""
        self.registry.register(QueueCollector(engine))

    def serve(self, port: int, host: str = "0.0.0.0") -> Any:
        """Serve ``/metrics`` on its own port in a daemon thread (workers, reaper)."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        logger.info("metrics served", extra={"port": port})
        return server, thread
