"""What every part of the Docker runner shares about the engine: its errors, the statuses of
a container, its times, and the fence before each call."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import docker
import docker.errors
import requests.exceptions

from runyard.domain.attempt import AttemptSpec
from runyard.runner import AttemptAbandoned, AttemptControl, RunnerUnavailable

TRANSPORT_ERRORS = (
    docker.errors.APIError,
    docker.errors.DockerException,
    requests.exceptions.RequestException,
)
RUNNING = ("running", "paused", "restarting")
# Someone is removing the container (or a removal failed half-way): its logs answer 409 and
# its outputs cannot be trusted, so the attempt's container counts as lost.
GOING = ("removing", "dead")


def parse_docker_time(value: str | None) -> datetime | None:
    """An engine timestamp as a datetime; None for none or Docker's zero time."""
    if not value or value.startswith("0001-"):
        return None
    # Docker reports nanoseconds; Python keeps microseconds.
    main, _, frac = value.rstrip("Z").partition(".")
    frac = (frac + "000000")[:6]
    return datetime.fromisoformat(f"{main}.{frac}+00:00")


def engine_message(exc: docker.errors.APIError) -> str:
    """The engine's own words, without the request's URL."""
    explanation = exc.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", errors="replace")
    return str(explanation or exc)


def inspect_container(api: Any, ref: str) -> dict[str, Any] | None:
    """The container's inspect document, or None when there is no such container."""
    try:
        attrs: dict[str, Any] = api.inspect_container(ref)
    except docker.errors.NotFound:
        return None
    except TRANSPORT_ERRORS as exc:
        raise RunnerUnavailable(f"cannot inspect container {ref}: {exc}") from exc
    return attrs


def unless_gone(call: Callable[[], object], what: str) -> None:
    """Make an engine call for which an object already gone is as good as done."""
    try:
        call()
    except docker.errors.NotFound:
        pass
    except TRANSPORT_ERRORS as exc:
        raise RunnerUnavailable(f"cannot {what}: {exc}") from exc


def fence(control: AttemptControl, spec: AttemptSpec) -> None:
    """Touch the engine only while this process still owns the attempt."""
    if control.abandon.is_set() or not control.still_owner():
        raise AttemptAbandoned(spec.container_name)
