"""How an exited attempt ends: one pure decision, used by every path that collects an attempt.

The worker, the sync-mode executor and an adopter all collect through the Docker runner,
which gathers the facts (``ExitFacts``) and asks ``decide_exit``; only when it answers
``read_result`` does the runner read ``result.json`` and ask ``decide_result``. The table in
docs/runner-contract.md is this function written out; tests/unit/test_outcomes.py checks
every row.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runyard.domain.states import ErrorCode, RunStatus


class StopReason(enum.StrEnum):
    """Why the owner stopped a running container."""

    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    IDLE = "idle_timeout"
    DISK = "disk_limit_exceeded"


@dataclass(frozen=True)
class ExitFacts:
    """What is known of an exited container when its outcome is decided."""

    exit_code: int
    oom_killed: bool
    finished_at: datetime | None
    deadline_at: datetime
    # Set only by the owner that stopped it; an adopter of an exited container has None.
    stopped_for: StopReason | None = None
    # The run's cancel was requested (a previous owner may have stopped it, then died).
    cancel_requested: bool = False
    # Bytes under /runyard when collected, if measured: a fill beyond the limit is evidence.
    disk_used_bytes: int | None = None


@dataclass(frozen=True)
class ToolLimits:
    """The limits named in error messages."""

    timeout_seconds: int
    memory_mb: int
    disk_mb: int
    idle_timeout_seconds: int | None = None

    @classmethod
    def of(cls, tool: dict[str, Any]) -> ToolLimits:
        """The limits of a run's tool snapshot."""
        idle = tool.get("idle_timeout_seconds")
        return cls(
            timeout_seconds=int(tool.get("timeout_seconds", 0)),
            memory_mb=int(tool.get("memory_mb", 0)),
            disk_mb=int(tool.get("disk_mb") or 1024),
            idle_timeout_seconds=int(idle) if idle else None,
        )


@dataclass(frozen=True)
class Verdict:
    """The decided outcome; ``read_result`` asks the caller to read result.json first."""

    status: RunStatus
    error_code: str | None = None
    error: str | None = None
    read_result: bool = False


# Exit codes of a process killed by SIGKILL or SIGTERM (128 + signal), as the init reports them.
SIGNAL_EXITS = (137, 143)
READ_RESULT = Verdict(status=RunStatus.SUCCEEDED, read_result=True)


def decide_exit(facts: ExitFacts, limits: ToolLimits) -> Verdict:
    """The outcome of an exited container, before its result is read."""
    failed = facts.exit_code != 0
    # A previous owner that stopped the container for a cancel, then died, leaves a container
    # killed by SIGTERM or SIGKILL; a tool that failed on its own keeps its own outcome.
    signalled = facts.exit_code in SIGNAL_EXITS and not facts.oom_killed
    if facts.stopped_for is StopReason.CANCELLED or (facts.cancel_requested and signalled):
        return Verdict(RunStatus.CANCELLED, ErrorCode.CANCELLED, "cancelled on request")
    late = facts.finished_at is not None and facts.finished_at >= facts.deadline_at
    if facts.stopped_for is StopReason.TIMED_OUT or (late and failed):
        return Verdict(
            RunStatus.TIMED_OUT,
            ErrorCode.TIMED_OUT,
            f"the tool ran past its {limits.timeout_seconds} s timeout",
        )
    if facts.stopped_for is StopReason.IDLE:
        return Verdict(
            RunStatus.TIMED_OUT,
            ErrorCode.IDLE_TIMEOUT,
            f"the tool printed nothing for {limits.idle_timeout_seconds} s",
        )
    over_disk = facts.disk_used_bytes is not None and facts.disk_used_bytes >= limits.disk_mb << 20
    if facts.stopped_for is StopReason.DISK or (over_disk and failed):
        return Verdict(
            RunStatus.FAILED,
            ErrorCode.DISK_LIMIT,
            f"the tool wrote more than {limits.disk_mb} MB under /runyard",
        )
    if facts.oom_killed:
        return Verdict(
            RunStatus.FAILED,
            ErrorCode.OOM_KILLED,
            f"the tool ran out of memory ({limits.memory_mb} MB)",
        )
    if facts.exit_code == SIGNAL_EXITS[0]:
        # The engine can miss an OOM kill (seen on cgroup v1 under load): say what is likely.
        return Verdict(
            RunStatus.FAILED,
            ErrorCode.TOOL_FAILED,
            f"the tool was killed by SIGKILL (exit 137); the engine recorded no out-of-memory "
            f"kill, but the memory limit ({limits.memory_mb} MB) is the usual cause",
        )
    if failed:
        return Verdict(
            RunStatus.FAILED, ErrorCode.TOOL_FAILED, f"the tool exited with code {facts.exit_code}"
        )
    return READ_RESULT


def decide_result(problem: str | None) -> Verdict:
    """After a clean exit: succeeded, or ``invalid_result`` when result.json was refused."""
    if problem is not None:
        return Verdict(RunStatus.FAILED, ErrorCode.INVALID_RESULT, problem)
    return Verdict(RunStatus.SUCCEEDED)
