"""Watches on a running attempt beyond its deadline: what it writes under /runyard, and
whether it has gone quiet.

Debian's engine (overlay2 on ext4) has no per-container disk quota, so the disk limit is a
watch: every poll the owner measures the attempt's ``/runyard`` directory on the engine's
host (its host work directory, or the named volume's mount point) and stops the container
once it holds more than ``disk_mb``. Each single file is also capped at ``disk_mb`` by the
``fsize`` ulimit, which the kernel enforces exactly.
"""

from __future__ import annotations

import enum
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

# A tool that makes this many files under /runyard is stopped as if it had filled the disk:
# inodes are disk too, and the walk that measures it must stay cheap.
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class DiskUse:
    """Bytes allocated under a directory, and whether the count stopped at ``MAX_ENTRIES``."""

    bytes: int
    entries: int

    @property
    def too_many_entries(self) -> bool:
        """The walk met more entries than a tool may make."""
        return self.entries > MAX_ENTRIES


def measure(root: Path) -> DiskUse | None:
    """Allocated bytes under ``root`` (links are not followed), or None if it is gone."""
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
                    if entries > MAX_ENTRIES:
                        return DiskUse(total, entries)
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
