"""Prometheus metrics: one registry per process, exported by the roles the process runs, plus
database-derived gauges at scrape time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from sqlalchemy import Engine, text

from runyard.queue.values import SYNC_QUEUE, WORKER_LIVE_SECONDS
from runyard.reads.pools import live_workers_by_queue
from runyard.reads.usage_metrics import UsageCollector
from runyard.usage.ledger import UsageLedger

logger = logging.getLogger(__name__)

C = TypeVar("C", bound=MetricWrapperBase)

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


class Role(StrEnum):
    """The part of runyard that writes a series: a process exports the series of the parts it
    runs, so no process shows another's series stuck at their initial value."""

    API = "api"
    # Running attempts: a worker, or the API in sync mode.
    ATTEMPTS = "attempts"
    WORKER = "worker"
    REAPER = "reaper"
    WEBHOOKS = "webhooks"


HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class Metrics:
    """Every series a runyard process may write, exported in ``registry`` by role: the
    processes of ``runyard dev`` share one, the split services have one each."""

    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )

    def __post_init__(self) -> None:
        self._roles: dict[Role, list[MetricWrapperBase]] = {role: [] for role in Role}
        self._exported: set[Role] = set()
        self._lock = threading.Lock()
        self._queue_watched = False

        def counter(role: Role, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return self._keep(role, Counter(name, doc, labels, registry=None))

        def gauge(role: Role, name: str, doc: str) -> Gauge:
            return self._keep(role, Gauge(name, doc, registry=None))

        def histogram(
            role: Role, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()
        ) -> Histogram:
            return self._keep(role, Histogram(name, doc, labels, buckets=buckets, registry=None))

        api, attempts, worker = Role.API, Role.ATTEMPTS, Role.WORKER
        self.submissions = counter(
            api, "runyard_api_submissions", "Runs submitted, by result", ["result"]
        )
        self.http_requests = counter(
            api,
            "runyard_http_requests",
            "HTTP requests answered, by method, route template and status code",
            ["method", "route", "status"],
        )
        self.http_duration = histogram(
            api,
            "runyard_http_request_duration_seconds",
            "Request received to response sent, by method and route template",
            HTTP_BUCKETS,
            ["method", "route"],
        )
        self.adoptions = counter(attempts, "runyard_adoptions", "Adoptions by outcome", ["outcome"])
        self.outcomes = counter(
            attempts,
            "runyard_runs_finished",
            "Runs finalized, by status and error code",
            ["status", "error_code"],
        )
        self.attempts = histogram(
            attempts, "runyard_run_attempts", "Attempts a run took", (1, 2, 3, 5, 10)
        )
        self.duration = histogram(
            attempts, "runyard_run_duration_seconds", "Started to finished", DURATION_BUCKETS
        )
        self.leases_lost = counter(attempts, "runyard_leases_lost", "Leases found taken away")
        self.unstorable_outcomes = counter(
            attempts,
            "runyard_worker_unstorable_outcomes",
            "Outcomes the database refused, stored as internal_error instead",
        )
        self.db_clock_offset = gauge(
            attempts,
            "runyard_worker_db_clock_offset_seconds",
            "Database clock minus this host's clock, as the heartbeat measures it",
        )
        self.requeues = counter(
            attempts, "runyard_requeues", "Attempts put back, by reason", ["reason"]
        )
        self.claims = counter(worker, "runyard_claims", "Jobs claimed (new attempts)")
        self.wait_time = histogram(
            worker, "runyard_job_wait_seconds", "Requested to started", DURATION_BUCKETS
        )
        self.heartbeat_failures = counter(
            worker,
            "runyard_worker_heartbeat_failures",
            "Heartbeat rounds that did not complete in time",
        )
        self.handovers = counter(
            worker,
            "runyard_worker_handovers",
            "Times the worker handed its runs over because leases could not be renewed",
        )
        self.claiming = gauge(
            worker, "runyard_worker_claiming", "1 while the worker claims, 0 while paused"
        )
        self.claiming.set(1)
        self.loop_errors = counter(
            worker,
            "runyard_worker_loop_errors",
            "Unexpected errors caught by the worker's loops, by loop",
            ["loop"],
        )
        self.connections_cut = counter(
            worker,
            "runyard_worker_db_connections_cut",
            "Database connections cut after their peer stopped answering",
        )
        self.slots_busy = gauge(worker, "runyard_worker_slots_busy", "Slots running an attempt")
        self.slots_total = gauge(worker, "runyard_worker_slots", "Slots of this worker")
        self.engine_up = gauge(
            worker, "runyard_worker_engine_up", "1 while this worker's engine answers"
        )
        self.engine_probe_failures = counter(
            worker, "runyard_worker_engine_probe_failures", "Engine probes that got no answer"
        )
        self.reaper_actions = counter(
            Role.REAPER, "runyard_reaper_actions", "What the reaper did", ["action"]
        )
        self.webhook_attempts = counter(
            Role.WEBHOOKS,
            "runyard_webhook_attempts",
            "Webhook delivery attempts, by outcome (delivered, retrying, gave_up)",
            ["outcome"],
        )

    def _keep(self, role: Role, collector: C) -> C:
        self._roles[role].append(collector)
        return collector

    def export(self, *roles: Role) -> Metrics:
        """Export the series of ``roles`` in the registry (once each); returns ``self``."""
        with self._lock:
            for role in roles:
                if role not in self._exported:
                    for collector in self._roles[role]:
                        self.registry.register(collector)
                    self._exported.add(role)
        return self

    @property
    def exported(self) -> frozenset[Role]:
        """The roles whose series the registry exports."""
        return frozenset(self._exported)

    def names(self, role: Role) -> list[str]:
        """The metric names of ``role``'s series (as ``describe`` gives them)."""
        return [family.name for c in self._roles[role] for family in c.describe()]

    def watch_queue(self, engine: Engine) -> None:
        """Also export the database-derived queue gauges and usage counters (once: the
        processes of ``runyard dev`` share the registry and the database)."""
        with self._lock:
            if not self._queue_watched:
                self.registry.register(QueueCollector(engine))
                self.registry.register(UsageCollector(UsageLedger(engine)))
                self._queue_watched = True

    def serve(self, port: int, host: str = "0.0.0.0") -> Any:
        """Serve ``/metrics`` on its own port in a daemon thread (workers, reaper)."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        logger.info("metrics served", extra={"port": port})
        return server, thread
