"""Sandboxes as rules: how one ends, when it is idle, how a command and its output are
checked and cut. No I/O: ``runyard.sandboxes`` carries them out."""

from __future__ import annotations

import enum
import posixpath
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from runyard.domain.states import ErrorCode, RunStatus

# Where the sandbox's files live, and where the commands' output is captured (outside it).
WORKSPACE = "/runyard/out/workspace"
EXECS_DIR = "/runyard/out/.execs"

# The ends of a sandbox, as ``error_code`` of its run.
TTL_EXPIRED = "ttl_expired"
SANDBOX_EXITED = "sandbox_exited"
SANDBOX_ENDED = "sandbox_ended"

MAX_COMMAND_ARGS = 256
MAX_COMMAND_BYTES = 65_536
MAX_ENV_VARS = 64
MAX_ENV_BYTES = 32_768
MAX_EXECS_CEILING = 16
# The most commands one sandbox may be asked in its life: each keeps its output (capped) in
# the database until the sandbox's run goes.
MAX_EXECS_TOTAL = 10_000
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class EndReason(enum.StrEnum):
    """Why a sandbox ended, as its readers see it."""

    DELETED = "deleted"
    TTL = "ttl"
    IDLE = "idle"
    CONTAINER_EXITED = "container_exited"
    CONTAINER_LOST = "container_lost"
    ERROR = "error"


@dataclass(frozen=True)
class EndFacts:
    """What the owner knows when the sandbox's container has stopped."""

    delete_requested: bool
    ttl_passed: bool
    idle_passed: bool
    exit_code: int | None
    # The status and code the container's exit alone would give (the runner's outcome).
    status: RunStatus
    error_code: str | None


@dataclass(frozen=True)
class End:
    """The outcome a sandbox's run is finalized with."""

    status: RunStatus
    error_code: str | None
    error: str | None


def end_of(facts: EndFacts) -> End:
    """How a sandbox whose container stopped ends: a delete, the TTL and the idle timeout
    explain a stop first; else an engine or runyard error keeps its own code; else the
    container exited by itself (its keeper died, it ran out of memory, the engine stopped)."""
    if facts.delete_requested:
        return End(RunStatus.CANCELLED, ErrorCode.CANCELLED, "the sandbox was deleted")
    if facts.ttl_passed:
        return End(RunStatus.TIMED_OUT, TTL_EXPIRED, "the sandbox reached its ttl")
    if facts.idle_passed:
        return End(
            RunStatus.TIMED_OUT,
            ErrorCode.IDLE_TIMEOUT,
            "the sandbox was idle (no exec, no file access) past its idle timeout",
        )
    if facts.error_code == ErrorCode.OOM_KILLED:
        return End(RunStatus.FAILED, ErrorCode.OOM_KILLED, "the sandbox ran out of memory")
    if facts.status is RunStatus.FAILED and facts.error_code not in (None, ErrorCode.TOOL_FAILED):
        return End(RunStatus.FAILED, facts.error_code, None)
    code = "unknown" if facts.exit_code is None else str(facts.exit_code)
    return End(
        RunStatus.FAILED,
        SANDBOX_EXITED,
        f"the sandbox's container stopped by itself (exit code {code})",
    )


def reason_of(status: RunStatus, error_code: str | None) -> EndReason | None:
    """Why a sandbox ended, from its run's status and code; None while it lives."""
    if not status.is_terminal:
        return None
    by_code = {
        ErrorCode.CANCELLED.value: EndReason.DELETED,
        TTL_EXPIRED: EndReason.TTL,
        ErrorCode.TIMED_OUT.value: EndReason.TTL,
        ErrorCode.IDLE_TIMEOUT.value: EndReason.IDLE,
        SANDBOX_EXITED: EndReason.CONTAINER_EXITED,
        ErrorCode.OOM_KILLED.value: EndReason.CONTAINER_EXITED,
        ErrorCode.CONTAINER_LOST.value: EndReason.CONTAINER_LOST,
    }
    if status is RunStatus.CANCELLED:
        return EndReason.DELETED
    return by_code.get(error_code or "", EndReason.ERROR)


def idle_passed(
    now: datetime, last_active_at: datetime, idle_timeout_seconds: int, running_execs: int
) -> bool:
    """A sandbox is idle once no command runs and no caller used it for its idle timeout."""
    if running_execs > 0:
        return False
    return now - last_active_at >= timedelta(seconds=idle_timeout_seconds)


def exec_timed_out(now: datetime, started_at: datetime | None, timeout_seconds: int) -> bool:
    """A started command past its own timeout is killed."""
    return started_at is not None and now - started_at >= timedelta(seconds=timeout_seconds)


def startable(pending: int, running: int, max_execs: int) -> int:
    """How many pending commands may start now, with ``running`` ones at most ``max_execs``."""
    return max(0, min(pending, max_execs - running))


def command_problem(command: list[str]) -> str | None:
    """Why a command cannot be run; None if it can."""
    if not command:
        return "command must name a program"
    if len(command) > MAX_COMMAND_ARGS:
        return f"command has more than {MAX_COMMAND_ARGS} arguments"
    if any("\x00" in part for part in command):
        return "command must not contain NUL characters"
    if sum(len(part.encode()) for part in command) > MAX_COMMAND_BYTES:
        return f"command is longer than {MAX_COMMAND_BYTES} bytes"
    return None


def env_problem(env: dict[str, str]) -> str | None:
    """Why an environment cannot be given to a command; None if it can."""
    if len(env) > MAX_ENV_VARS:
        return f"env has more than {MAX_ENV_VARS} variables"
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            return f"env name {name!r} is not a variable name"
        if name.startswith("RUNYARD_"):
            return f"env name {name!r}: RUNYARD_ names are the platform's"
        if "\x00" in value:
            return f"env {name} must not contain NUL characters"
    if sum(len(k.encode()) + len(v.encode()) for k, v in env.items()) > MAX_ENV_BYTES:
        return f"env is larger than {MAX_ENV_BYTES} bytes"
    return None


def workspace_dir(cwd: str | None) -> str | None:
    """The absolute directory a command starts in (relative to the workspace), or None when
    ``cwd`` leaves the workspace."""
    if cwd is None or cwd in ("", "."):
        return WORKSPACE
    if "\x00" in cwd:
        return None
    joined = posixpath.normpath(posixpath.join(WORKSPACE, cwd))
    if joined != WORKSPACE and not joined.startswith(WORKSPACE + "/"):
        return None
    return joined


def complete_utf8(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a whole UTF-8 character: a chunk cut there
    never splits one (a trailing partial character waits for the next read)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)
        if byte >= 0xC0:  # a lead byte: is its character whole?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def event_id(stdout_end: int, stderr_end: int) -> str:
    """The SSE id after a chunk: both streams' stored ends, so a resume is exact."""
    return f"{stdout_end}-{stderr_end}"


def parse_event_id(value: str | None) -> tuple[int, int] | None:
    """The stream ends an SSE id names; None when it is not one of ours."""
    if not value:
        return (0, 0)
    out, sep, err = value.partition("-")
    if not sep or not out.isdigit() or not err.isdigit() or len(value) > 40:
        return None
    return int(out), int(err)
