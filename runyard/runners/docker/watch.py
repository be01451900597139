"""Watches on a running attempt beyond its deadline: what it writes under /runyard, and
whether it has gone quiet.

Debian's engine (overlay2 on ext4) has no per-container disk quota, so the disk limit is a
watch: every poll the owner measures the attempt's ``/runyard`` directory on the engine's
host (its host work directory, or the named volume's mount point) and stops the container
once it holds more than ``disk_mb``. Each single file is also capped at ``disk_mb`` by the
``fsize`` ulimit, which the kernel enforces exactly. The dependencies' artifacts the platform
copied in are not the tool's: the watch allows room for them on top of ``disk_mb``, what
it measures under ``deps/`` at its first poll (they are all there before the container
starts) and never more than their recorded sizes allow for (``deps_room``).
"""

from __future__ import annotations

import enum
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runyard.artifacts.deps_out import DEPS_DIR, DepsRoom
from runyard.domain.outcomes import StopReason, ToolLimits

logger = logging.getLogger(__name__)

# A tool that makes this many files under /runyard is stopped as if it had filled the disk:
# inodes are disk too, and the walk that measures it must stay cheap.
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class DiskUse:
    """Bytes allocated under a directory, and whether the count stopped at ``MAX_ENTRIES``."""

    bytes: int
    entries: int
    max_entries: int = MAX_ENTRIES

    @property
    def too_many_entries(self) -> bool:
        """The walk met more entries than a tool may make."""
        return self.entries > self.max_entries


def measure(root: Path, max_entries: int = MAX_ENTRIES) -> DiskUse | None:
    """Allocated bytes under ``root`` (links are not followed), or None if it is gone; the
    walk stops after ``max_entries`` entries."""
    total = entries = 0
    stack = [str(root)]
    try:
        os.lstat(root)
    except FileNotFoundError:
        return None
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as listing:
                for entry in listing:
                    entries += 1
                    if entries > max_entries:
                        return DiskUse(total, entries, max_entries)
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
    return DiskUse(total, entries)


def deps_use(workdir: Path, bound: DepsRoom) -> DepsRoom:
    """What the dependencies' artifacts under ``workdir/deps`` take as measured now, at most
    ``bound`` (what their sizes allow for, which a tool that writes there cannot pass): a file
    system that stores them in less gives the tool nothing more."""
    if bound == DepsRoom():
        return bound
    top = workdir / DEPS_DIR
    try:
        info = os.lstat(top)
    except FileNotFoundError:
        return DepsRoom()
    except OSError:
        return bound
    if not stat.S_ISDIR(info.st_mode):
        return DepsRoom()  # not what the platform made: nothing to allow for
    use = measure(top, bound.entries)
    if use is None or use.too_many_entries:
        return DepsRoom() if use is None else bound
    # ``measure`` counts what is in the directory; the directory itself is an entry too.
    return DepsRoom(
        min(bound.bytes, use.bytes + info.st_blocks * 512), min(bound.entries, use.entries + 1)
    )


class IdleAction(enum.Enum):
    """What the idle rule asks of the owner now."""

    NONE = "none"
    WARN = "stale"
    STOP = "stop"


@dataclass
class IdleClock:
    """The idle rule: ``stale`` after half the limit without output, stop at the limit."""

    limit_seconds: float
    last_output: float
    warned: bool = field(default=False)

    def output_seen(self, at: float) -> None:
        """The tool printed something at monotonic time ``at``."""
        self.last_output = max(self.last_output, at)
        self.warned = False

    def check(self, now: float) -> IdleAction:
        """The action due at monotonic time ``now`` (a warning is given once per silence)."""
        quiet = now - self.last_output
        if quiet >= self.limit_seconds:
            return IdleAction.STOP
        if quiet >= self.limit_seconds / 2 and not self.warned:
            self.warned = True
            return IdleAction.WARN
        return IdleAction.NONE


class AttemptWatch:
    """The disk and idle watches of one running attempt, checked from the owner's poll loop.

    ``workdir`` says where this host sees the attempt's /runyard (None: the engine is
    elsewhere, and only the per-file cap holds); ``output_marker`` returns something that
    changes whenever the tool prints; ``deps_room`` what the dependencies' artifacts in
    /runyard take, which is not charged to the tool; ``inspected`` hands those the
    container's inspect document read by the owner, so they need not ask for one.
    """

    def __init__(
        self,
        limits: ToolLimits,
        *,
        workdir: Callable[[], Path | None],
        output_marker: Callable[[], object],
        note: Callable[[str, dict[str, Any]], None],
        log_extra: dict[str, Any],
        clock: Callable[[], float] = time.monotonic,
        deps_room: Callable[[], DepsRoom] = DepsRoom,
        inspected: Callable[[dict[str, Any]], None] = lambda attrs: None,
    ) -> None:
        self.limits = limits
        # Told the container's inspect document when its owner reads one anyway.
        self.inspected = inspected
        self._find_workdir = workdir
        self._find_deps_room = deps_room
        self._deps_room: DepsRoom | None = None
        self._output_marker = output_marker
        self._note = note
        self._log_extra = log_extra
        self._clock = clock
        self._path: Path | None = None
        self._resolved = False
        idle = limits.idle_timeout_seconds
        self._idle = IdleClock(float(idle), clock()) if idle else None
        self._marker: object = None
        self._next_idle_poll = 0.0

    def _workdir(self) -> Path | None:
        if not self._resolved:
            self._resolved = True
            self._path = self._find_workdir()
            if self._path is None:
                logger.warning(
                    "cannot see /runyard of this attempt: disk_mb is enforced per file only",
                    extra=self._log_extra,
                )
        return self._path

    def disk_used(self) -> int | None:
        """Bytes the tool has under the attempt's /runyard now, its dependencies' artifacts
        not counted (None if it cannot be seen from here)."""
        path = self._workdir()
        if path is None:
            return None
        if self._deps_room is None:
            self._deps_room = deps_use(path, self._find_deps_room())
        room = self._deps_room
        use = measure(path, MAX_ENTRIES + room.entries)
        if use is None:
            return None
        if use.too_many_entries:
            return self.limits.disk_mb << 20
        return max(0, use.bytes - room.bytes)

    def check(self) -> StopReason | None:
        """The reason to stop the container now, if any."""
        used = self.disk_used()
        if used is not None and used >= self.limits.disk_mb << 20:
            return StopReason.DISK
        if self._idle is None:
            return None
        now = self._clock()
        if now >= self._next_idle_poll:
            self._next_idle_poll = now + min(1.0, self._idle.limit_seconds / 4)
            marker = self._output_marker()
            if marker is not None and marker != self._marker:
                # The tool printed since the previous poll (or before the first one, which
                # only makes the watch more patient).
                self._idle.output_seen(now)
                self._marker = marker
        action = self._idle.check(now)
        if action is IdleAction.WARN:
            quiet = round(now - self._idle.last_output)
            self._note("stale", {"quiet_seconds": quiet})
        return StopReason.IDLE if action is IdleAction.STOP else None
