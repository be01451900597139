"""Which errors of the engine refuse a container for its own settings, as one pure function.

A refusal is about the run (a CPU count the host does not have, a command the image lacks, a
limit the kernel will not take): asking again gives the same answer, so the run fails at once
with ``container_refused`` and the engine's message. Anything else (no answer, an engine 5xx
about its own state) is engine trouble: the worker gives the run back and pauses its claims
until the engine answers (docs/workers.md). The messages are Docker's own; the table test in
``tests/unit/test_docker_refusals.py`` holds real ones.
"""

from __future__ import annotations

# Client errors that say nothing about the container's settings: a container gone or one
# already there (adopted instead), a slow or busy engine, and a socket proxy in front of the
# engine that refuses the worker (401, 403: its configuration, not the run's).
_NOT_REFUSALS = frozenset({401, 403, 404, 408, 409, 429})

# A 5xx that still is the settings' fault: the runtime or the daemon's checks refusing a value
# of the container (every phrase of one entry must be in the message).
_CONFIG_ERRORS_5XX: tuple[tuple[str, ...], ...] = (
    # runc writing a CPU quota below the kernel's minimum (less than 0.01 CPU).
    ("oci runtime", "error setting cgroup config", "invalid argument"),
    # An rlimit above what the engine itself may grant.
    ("oci runtime", "error setting rlimit"),
    # Engines that answer 500 where newer ones answer 400 for the tool's own command.
    ("oci runtime", "executable file not found"),
    ("oci runtime", "exec format error"),
    ("uids and gids must be in range",),
    # Older engines' 500s for the daemon's own checks of the limits.
    ("range of cpus is from",),
    ("minimum memory limit allowed is",),
    ("minimum memoryswap limit",),
)


def refused_for_settings(status: int | None, message: str) -> bool:
    """Whether the engine's error (its HTTP ``status``, None when it never answered, and its
    message) refuses the container for its own settings, for good."""
    if status is None or status < 400:
        return False
    if status < 500:
        return status not in _NOT_REFUSALS
    text = message.lower()
    return any(all(phrase in text for phrase in phrases) for phrases in _CONFIG_ERRORS_5XX)


def name_in_use(status_code: int | None, message: str) -> bool:
    """Whether a create was refused because a container of that name exists: Docker answers
    409; Podman's compatible API answers 500 and says so (``the container name ... is already
    in use``)."""
    return status_code == 500 and "is already in use" in message.lower()
