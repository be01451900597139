"""Rules of builds as pure functions: what a new holder does, what a failure says."""

from __future__ import annotations

import enum

TAIL_LINES = 20
TAIL_CHARS = 2000


class BuildAction(enum.StrEnum):
    """What the holder of a freshly claimed build does."""

    BUILD = "build"  # build it (first time, or again after a worker died mid-build)
    ADOPT = "adopt"  # the engine already has the image: record it ready, build nothing
    GIVE_UP = "give_up"  # its attempts are spent by workers that died: fail it


def on_claim(
    *, image_present: bool, recovered: bool, attempts: int, max_attempts: int
) -> BuildAction:
    """A build whose image the engine has is ready whoever made it (the tag is content
    addressed); a build lost more times than it may be tried fails; else it is built."""
    if image_present:
        return BuildAction.ADOPT
    if recovered and attempts > max_attempts:
        return BuildAction.GIVE_UP
    return BuildAction.BUILD


def log_tail(log: str, *, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str:
    """The last ``lines`` non-empty lines of a build log, at most ``chars`` characters."""
    kept = [line for line in log.splitlines() if line.strip()][-lines:]
    tail = "\n".join(kept)
    return tail[-chars:]


def failure_message(tag: str, reason: str, log: str) -> str:
    """What a failed build and the runs that waited for it say: the reason, then the log's
    tail."""
    tail = log_tail(log)
    head = f"build of {tag} failed: {reason}"
    return f"{head}\n{tail}" if tail else head


def timeout_reason(seconds: int) -> str:
    """The reason of a build stopped at its deadline."""
    return f"build timed out after {seconds} s (build_timeout_seconds)"


def lost_reason(attempts: int) -> str:
    """The reason of a build whose workers died on every attempt."""
    return f"the build was lost {attempts - 1} times (worker gone mid-build)"
