"""The floor and ceiling of every limit a tool or a run can set, as pure data and one check.

No registry entry, run request or operator maximum can leave these bounds (docs/tools.md,
"Limits"). The floors are where the engine stops limiting: Docker reads 0 CPUs or 0 pids as
"no limit", turns less than 0.01 CPU into no quota at all or a start the runtime refuses,
and refuses less than 6 MB of memory. The ceilings keep one entry from asking for a whole
host (or a worker's memory, for the output caps the worker holds while it reads them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """The range one limit must stay in, and the unit it is counted in."""

    floor: float
    ceiling: float
    unit: str

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the range, or None when it is inside."""
        if math.isfinite(value) and self.floor <= value <= self.ceiling:
            return None
        return f"must be from {_number(self.floor)} to {_number(self.ceiling)} {self.unit}"


# Docker's own minimum CPU share (NanoCpus of 10,000,000): below it the quota is 0 (no limit)
# or one the kernel refuses.
MIN_CPUS = 0.01
# Docker's minimum memory limit (``Minimum memory limit allowed is 6MB``).
MIN_MEMORY_MB = 6

BOUNDS: dict[str, Bound] = {
    "cpus": Bound(MIN_CPUS, 256, "CPUs"),
    "memory_mb": Bound(MIN_MEMORY_MB, 1_048_576, "MB"),
    "pids_limit": Bound(1, 65_536, "processes"),
    "timeout_seconds": Bound(1, 604_800, "seconds"),
    "idle_timeout_seconds": Bound(2, 604_800, "seconds"),
    "disk_mb": Bound(1, 1_048_576, "MB"),
    "tmpfs_mb": Bound(1, 4096, "MB"),
    "nofile_limit": Bound(16, 65_536, "open files"),
    "artifacts_max_mb": Bound(1, 1_048_576, "MB"),
    "stdout_cap_bytes": Bound(1024, 268_435_456, "bytes"),
    "result_cap_bytes": Bound(1024, 268_435_456, "bytes"),
}

# A tool's ``max_*`` fields and the operator's ``RUNYARD_MAX_*`` settings bound the same
# quantity as the limit they name.
BOUNDS["max_timeout_seconds"] = BOUNDS["timeout_seconds"]
BOUNDS["max_memory_mb"] = BOUNDS["memory_mb"]
BOUNDS["max_cpus"] = BOUNDS["cpus"]


def limit_problem(name: str, value: float) -> str | None:
    """Why ``value`` is no valid ``name`` limit (``cpus``, ``memory_mb``, ...), or None."""
    return BOUNDS[name].problem(value)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
