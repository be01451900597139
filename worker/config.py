"""A worker's configuration: its slots, leases, heartbeats, queues and backoffs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to know; validated by ``Settings`` upstream."""

    worker_id: str
    concurrency: int = 4
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    poll_seconds: float = 1.0
    queues: tuple[str, ...] = ("default",)
    sweep_interval_seconds: float = 60.0
    # Bound of one heartbeat round, and the part of the lease held in reserve: the worker
    # stops acting as owner this long before the lease it last renewed runs out.
    # None: half of the smaller of the interval and the lease left after one interval.
    heartbeat_timeout_seconds: float | None = None
    # The server-side timeout of the worker's statements (0: none).
    statement_timeout_seconds: float = 30.0

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds one heartbeat round may take; also the lease's safety margin."""
        if self.heartbeat_timeout_seconds is not None:
            return self.heartbeat_timeout_seconds
        room = min(self.heartbeat_seconds, self.lease_seconds - self.heartbeat_seconds)
        return max(room / 2, 0.1)

    # While the engine does not answer: probes (and re-adoptions) back off from base to max.
    engine_backoff_base_seconds: float = 1.0
    engine_backoff_max_seconds: float = 30.0
    # How the runner gives attempts their input ("host" or "upload"), for the start log.
    inputs: str = "upload"
