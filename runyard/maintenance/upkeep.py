"""Retention and webhook delivery on threads of their own, for a sync-mode API process (the
reaper does both in queue mode; several processes doing them at once is safe)."""

from __future__ import annotations

import threading

from runyard.artifact_store import ArtifactStore
from runyard.maintenance.chores import Chore, Chores
from runyard.maintenance.retention import prune_expired
from runyard.queue import JobQueue
from runyard.webhooks.delivery import WebhookDeliverer


class Upkeep:
    """Prunes expired runs every ``interval_seconds`` and delivers webhooks until ``stop()``.

    Deliveries get a thread apart from the pruning: an attempt may take its whole timeout.
    """

    def __init__(
        self,
        queue: JobQueue,
        deliverer: WebhookDeliverer,
        *,
        retention_seconds: float | None,
        batch_size: int,
        interval_seconds: float,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        self._deliverer = deliverer

        def prune() -> int:
            return prune_expired(
                queue,
                retention_seconds=retention_seconds,
                batch=batch_size,
                artifacts=artifacts,
            )

        self._chores = Chores(
            [Chore("retention", interval_seconds, prune)], thread_name="runyard-retention"
        )
        self._thread = threading.Thread(
            target=deliverer.run_forever, name="runyard-webhooks", daemon=True
        )

    def start(self) -> None:
        """Start both threads."""
        self._chores.start()
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop both, waiting for the prune and the attempts in progress up to ``timeout``."""
        self._deliverer.stop()
        self._chores.stop(timeout)
        if self._thread.is_alive():
            self._thread.join(timeout)
