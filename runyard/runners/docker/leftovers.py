"""What the engine keeps of attempts: removed after the terminal commit, listed for the sweep."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import docker.errors

from runyard.domain.attempt import ManagedAttempt, container_name
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.egress import EgressGate
from runyard.runners.docker.engine_calls import RUNNING, TRANSPORT_ERRORS, unless_gone
from runyard.runners.docker.host_workdirs import AttemptDirs
from runyard.runners.docker.labels import LABEL_MANAGED, attempt_of
from runyard.runners.docker.usage_meter import UsageMeter

logger = logging.getLogger(__name__)

STUCK_MOUNT = "volume has active mounts"


class AttemptLeftovers:
    """The containers, volumes, directories and proxies of attempts, as the engine keeps them."""

    def __init__(self, api: Any, dirs: AttemptDirs, egress: EgressGate, meter: UsageMeter) -> None:
        self._api = api
        self._dirs = dirs
        self._egress = egress
        self._meter = meter
        # Volumes the engine refuses to remove while it counts a mount no container holds.
        self._stuck_volumes: set[str] = set()

    def remove(self, ref: str) -> None:
        """Remove the container, whatever its state; one already gone is fine."""
        unless_gone(lambda: self._api.remove_container(ref, force=True), f"remove {ref}")

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove the attempt's container and volume (after the terminal commit)."""
        name = container_name(run_id, attempt)
        self.remove(name)
        self._remove_volume(name)
        self._egress.discard(name)
        self._meter.forget(name)
        if self._dirs.workdirs is not None:
            self._dirs.workdirs.remove(name)

    def _remove_volume(self, name: str) -> None:
        """Remove the attempt's volume; one the engine says is still mounted with no container
        left is given up on (logged once), and the sweep stops listing it."""
        try:
            self._api.remove_volume(name, force=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if STUCK_MOUNT not in str(exc.explanation or exc):
                raise RunnerUnavailable(f"cannot remove volume {name}: {exc}") from exc
            # Docker 20.10 with live-restore never forgets the mount of a bind-backed volume
            # whose container ran across a dockerd restart: the record stays until the
            # engine's next restart; the directory behind it is removed all the same.
            if name not in self._stuck_volumes:
                self._stuck_volumes.add(name)
                logger.warning(
                    "the engine keeps a volume it says is still mounted; left to its next restart",
                    extra={"volume": name, "error": str(exc.explanation or exc)},
                )
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot remove volume {name}: {exc}") from exc

    def managed_attempts(self) -> list[ManagedAttempt]:
        """Labelled containers, and labelled volumes left without their container."""
        selector = {"label": f"{LABEL_MANAGED}=true"}
        found: dict[tuple[uuid.UUID, int], ManagedAttempt] = {}
        try:
            # The list's own summaries carry labels and state: no inspect per container.
            containers = self._api.containers(all=True, filters=selector)
            volumes = self._api.volumes(filters=selector).get("Volumes") or []
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot list managed containers: {exc}") from exc
        for summary in containers:
            attempt = attempt_of(summary.get("Labels") or {})
            if attempt is not None:
                running = summary.get("State") in RUNNING
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], running)
        for volume in volumes:
            attempt = attempt_of(volume.get("Labels") or {})
            if volume.get("Name") in self._stuck_volumes:
                continue
            if attempt is not None and attempt not in found:
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], False)
        workdirs = self._dirs.workdirs
        for attempt in workdirs.attempts() if workdirs is not None else []:
            if attempt not in found:
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], False)
        # Egress proxies of these attempts go with their discard; those of none, now.
        self._egress.note_leftovers({container_name(*attempt) for attempt in found})
        return list(found.values())
