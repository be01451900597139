"""Whether the worker's container engine answers, and how long to wait before asking again.

A worker claims only while its engine answers. When it stops answering, the worker stops
claiming, stops reporting itself alive (so the reaper can hand its runs to other engines after
``RUNYARD_ENGINE_DEAD_AFTER_SECONDS``), and probes the engine with a capped exponential
backoff until it answers again.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from runyard.reads.metrics import Metrics
from runyard.runner import RunnerUnavailable

logger = logging.getLogger(__name__)

# 2**60 seconds is far beyond any cap; the exponent stops there so it never overflows.
_MAX_DOUBLINGS = 60


def backoff_delay(failures: int, base: float, cap: float, draw: float) -> float:
    """Equal jitter: a delay in ``[d/2, d]`` for ``d = min(cap, base * 2**(failures-1))``."""
    if failures <= 0:
        return 0.0
    ceiling = min(cap, base * 2.0 ** min(failures - 1, _MAX_DOUBLINGS))
    return ceiling * (0.5 + draw / 2)


class EngineHealth:
    """The engine's last known answer; thread-safe (slots report trouble, the loop probes)."""

    def __init__(
        self,
        probe: Callable[[], object],
        *,
        worker_id: str,
        base_seconds: float,
        max_seconds: float,
        metrics: Metrics,
        on_change: Callable[[bool], None] | None = None,
        draw: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._worker_id = worker_id
        self._base = base_seconds
        self._cap = max_seconds
        self._metrics = metrics
        self._on_change = on_change
        self._draw = draw
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._down_since: float | None = None
        metrics.engine_up.set(1)

    @property
    def healthy(self) -> bool:
        """True until a probe fails, and again once one succeeds."""
        return self._down_since is None

    def check(self) -> bool:
        """Probe the engine now and record the answer; True if it answered."""
        try:
            self._probe()
        except RunnerUnavailable as exc:
            self._failed(str(exc))
            return False
        self._answered()
        return True

    def trouble(self, error: str) -> None:
        """An engine call failed: claim nothing until a later probe succeeds."""
        # No probe at once: an engine shutting down still answers on open connections.
        self._failed(error)

    def next_delay(self) -> float:
        """How long to wait before the next probe (the base while the engine answers)."""
        with self._lock:
            failures = max(self._failures, 1)
        return backoff_delay(failures, self._base, self._cap, self._draw())

    def _failed(self, error: str) -> None:
        with self._lock:
            self._failures += 1
            failures = self._failures
            went_down = self._down_since is None
            if went_down:
                self._down_since = self._clock()
        self._metrics.engine_probe_failures.inc()
        extra = {"worker_id": self._worker_id, "error": error, "failures": failures}
        if went_down:
            self._metrics.engine_up.set(0)
            logger.warning(
                "engine trouble; claiming paused and liveness withheld until it answers",
                extra={**extra, "action": "engine_down"},
            )
            self._changed(False)
        else:
            logger.info("engine still not answering", extra={**extra, "action": "engine_probe"})

    def _answered(self) -> None:
        with self._lock:
            since, self._down_since, self._failures = self._down_since, None, 0
        if since is None:
            return
        self._metrics.engine_up.set(1)
        logger.warning(
            "engine answers again; claiming resumed",
            extra={
                "worker_id": self._worker_id,
                "action": "engine_up",
                "down_seconds": round(self._clock() - since, 1),
            },
        )
        self._changed(True)

    def _changed(self, healthy: bool) -> None:
        if self._on_change is not None:
            self._on_change(healthy)
