"""Waiting on an attempt's running container under its deadline: the owner's checks each
poll (cancel, deadline, the disk and idle watches), the stop or kill they call for, and the
usage sampled meanwhile."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from sqlalchemy.exc import DBAPIError

from runyard.artifact_store import ArtifactStore
from runyard.artifacts.deps_out import DepsRoom, deps_files, deps_room
from runyard.domain.attempt import AttemptSpec
from runyard.domain.outcomes import StopReason, ToolLimits
from runyard.registry.tools import NO_NETWORK
from runyard.runner import AttemptAbandoned, AttemptControl, RunnerUnavailable
from runyard.runners.docker.engine_calls import (
    RUNNING,
    TRANSPORT_ERRORS,
    inspect_container,
    unless_gone,
)
from runyard.runners.docker.host_workdirs import AttemptDirs
from runyard.runners.docker.live_logs import AttemptLogs
from runyard.runners.docker.usage_meter import Sampling, UsageMeter
from runyard.runners.docker.watch import AttemptWatch

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5
# Live log followers start only for attempts still running this long after their start; a
# quicker attempt's log is sent to the sink once, from the stored log (``AttemptLogs.replay``).
LIVE_LOGS_AFTER_SECONDS = 1.0


class AttemptWaiter:
    """Waits for an attempt's container to exit, and stops it when its owner's checks say so."""

    def __init__(
        self, api: Any, dirs: AttemptDirs, meter: UsageMeter, stop_grace_seconds: float
    ) -> None:
        self._api = api
        self._dirs = dirs
        self._meter = meter
        self._stop_grace_seconds = stop_grace_seconds

    def wait(
        self,
        container_id: str,
        spec: AttemptSpec,
        control: AttemptControl,
        live: AttemptLogs,
        watch: AttemptWatch,
        sampling: Sampling,
    ) -> StopReason | None:
        """Wait for exit, sampling its usage meanwhile; stop the container on cancel, at the
        deadline, when it goes quiet for its idle limit, or kill it when it writes past its
        disk limit."""
        stopped_for: StopReason | None = None
        follow_at = time.monotonic() + LIVE_LOGS_AFTER_SECONDS
        first = True
        while True:
            if control.abandon.is_set():
                raise AttemptAbandoned(spec.container_name)
            if not first:
                sampling.poll()
                if stopped_for is None:
                    stopped_for = self._check_running(container_id, spec, control, watch)
            first = False
            now = time.monotonic()
            if now >= follow_at:
                live.start()
            remaining = (spec.deadline_at - control.clock()).total_seconds()
            timeout = max(0.05, min(POLL_SECONDS, remaining)) if stopped_for is None else 1.0
            if not live.started:
                timeout = min(timeout, max(0.05, follow_at - now))
            try:
                self._api.wait(container_id, timeout=timeout)
                break
            except requests.exceptions.ConnectionError as exc:
                if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                    raise RunnerUnavailable(f"lost the Docker engine: {exc}") from exc
            except requests.exceptions.ReadTimeout:
                continue
            except docker.errors.NotFound as exc:
                raise RunnerUnavailable(f"container {spec.container_name} disappeared") from exc
            except TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot wait on {spec.container_name}: {exc}") from exc
        return stopped_for

    def _check_running(
        self, container_id: str, spec: AttemptSpec, control: AttemptControl, watch: AttemptWatch
    ) -> StopReason | None:
        """One round of the owner's checks on a container that was running a poll ago."""
        reason: StopReason | None = None
        if control.cancel.is_set():
            reason = StopReason.CANCELLED
        elif control.clock() >= spec.deadline_at:
            # Only a container still running at its deadline is stopped for it: one an
            # adopter finds already exited keeps the outcome it finished with.
            reason = StopReason.TIMED_OUT
        else:
            reason = watch.check()
        if reason is None or not self._is_running(container_id):
            return None
        if reason is StopReason.DISK:
            # No grace for a disk fill: every second of it is more of the host's disk.
            self._kill(container_id)
        else:
            self._stop(container_id)
        logger.info(
            "stopping container",
            extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "reason": str(reason)},
        )
        return reason

    def watch(self, container_id: str, spec: AttemptSpec, control: AttemptControl) -> AttemptWatch:
        """The disk and idle watches of an attempt; what they look at is found on first use."""
        found: dict[str, Any] = {}

        def attrs() -> dict[str, Any]:
            if not found:
                found.update(inspect_container(self._api, container_id) or {"Config": {}})
            return found

        def inspected(seen: dict[str, Any]) -> None:
            # Labels and log path stay as created: any inspect document answers for them.
            if not found:
                found.update(seen)

        def workdir() -> Path | None:
            labels = attrs().get("Config", {}).get("Labels") or {}
            return self.workdir_path(spec.container_name, labels)

        def output_marker() -> object:
            return self.output_marker(container_id, attrs().get("LogPath"))

        return AttemptWatch(
            ToolLimits.of(spec.tool),
            workdir=workdir,
            output_marker=output_marker,
            note=control.note,
            log_extra={"run_id": str(spec.run_id), "attempt": spec.attempt},
            deps_room=lambda: _deps_room(spec, control.artifacts),
            inspected=inspected,
        )

    def sample(self, container_id: str, spec: AttemptSpec) -> Sampling:
        """Sample the running container's usage; a networked tool's network from its pid."""
        networked = str(spec.tool.get("network") or NO_NETWORK) != NO_NETWORK
        pid = None
        if networked:
            attrs = inspect_container(self._api, container_id) or {}
            pid = int((attrs.get("State") or {}).get("Pid") or 0) or None
        return self._meter.follow(container_id, spec.container_name, pid, networked)

    def output_marker(self, container_id: str, log_path: str | None) -> object:
        """Something that changes whenever the container prints: the log file's size and
        time where this host sees it, else the engine's last log entry (stamp and bytes;
        output without newlines keeps one stamp, so the bytes are part of it)."""
        if log_path:
            try:
                info = os.stat(log_path)
                return (info.st_ino, info.st_size, info.st_mtime_ns)
            except OSError:
                pass
        try:
            return bytes(
                self._api.logs(container_id, stdout=True, stderr=True, timestamps=True, tail=1)
            )
        except TRANSPORT_ERRORS:
            return None

    def workdir_path(self, name: str, labels: dict[str, str]) -> Path | None:
        """Where this host sees the attempt's /runyard, or None (the engine is elsewhere)."""
        host_dir = self._dirs.host_dir(name, labels)
        if host_dir is not None:
            return host_dir
        try:
            mountpoint = self._api.inspect_volume(name).get("Mountpoint")
        except TRANSPORT_ERRORS:
            return None
        if not mountpoint or not os.access(mountpoint, os.R_OK | os.X_OK):
            return None
        return Path(mountpoint)

    def _is_running(self, container_id: str) -> bool:
        attrs = inspect_container(self._api, container_id)
        if attrs is None:
            raise RunnerUnavailable(f"container {container_id} disappeared")
        return bool(attrs["State"]["Status"] in RUNNING)

    def _stop(self, container_id: str) -> None:
        """SIGTERM, the grace period, then SIGKILL (Docker's stop does exactly that)."""
        grace = int(self._stop_grace_seconds)
        unless_gone(lambda: self._api.stop(container_id, timeout=grace), f"stop {container_id}")

    def _kill(self, container_id: str) -> None:
        """SIGKILL at once; a container that has just exited is fine."""
        try:
            self._api.kill(container_id)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # not running any more
                raise RunnerUnavailable(f"cannot kill {container_id}: {exc}") from exc
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot kill {container_id}: {exc}") from exc


def _deps_room(spec: AttemptSpec, store: ArtifactStore | None) -> DepsRoom:
    """What the dependencies' artifacts copied into the attempt's /runyard take (not the
    tool's to pay for out of its ``disk_mb``), from the sizes the store recorded."""
    if not spec.dep_artifacts or store is None:
        return DepsRoom()
    try:
        return deps_room(deps_files(store, spec.dep_artifacts))
    except DBAPIError:
        raise  # the database's trouble: the worker classifies it
    except Exception as exc:  # the store's disk
        raise RunnerUnavailable(f"cannot read the dependencies' artifacts: {exc}") from exc
