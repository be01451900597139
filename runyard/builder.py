"""The builder port: what a worker asks of its engine to build an image from a context."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from runyard.domain.usage import BuildUsage, Counters


@dataclass(frozen=True)
class BuildRequest:
    """One build: the context as a tar, the Dockerfile in it, args, network and deadline."""

    tag: str
    tool: str
    digest: str
    context: bytes
    dockerfile: str
    args: Mapping[str, str] = field(default_factory=dict)
    network: str = "none"
    timeout_seconds: float = 600.0
    # What the build's steps consume is kept under this name (its parent cgroup), across
    # the workers that take it over, until ``forget_usage``; "": not metered.
    meter_name: str = ""


@dataclass(frozen=True)
class BuildResult:
    """How a build ended: the image id, or an error (``timed_out`` when the deadline hit)."""

    image_id: str | None = None
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Whether the image was built and tagged."""
        return self.image_id is not None


class BuilderUnavailable(Exception):
    """The engine did not answer: nothing is decided about the build."""


# Receives each piece of build output; returns False to stop the build (lease lost).
LogWriter = Callable[[str], bool]


class BuildMeter(Protocol):
    """Where a build's step containers are placed so that what they consume can be read
    after they are gone (the Docker runner's ``UsageMeter``, injected by the worker)."""

    def cgroup_parent(self, name: str) -> str | None:
        """The parent cgroup to place the steps under, if the engine places them by path."""
        ...

    def read(self, name: str, sampled: Counters) -> Counters:
        """The parent cgroup's counters (``sampled`` where it is not seen)."""
        ...

    def forget(self, name: str, *, quiet: bool = False) -> bool:
        """Remove the parent cgroup; False while a process in it is still dying."""
        ...


class Builder(Protocol):
    """Builds images on one engine (the Docker adapter is ``runyard.builders.docker``)."""

    def image_id(self, tag: str) -> str | None:
        """The id of the image tagged ``tag`` on the engine, or None."""
        ...

    def build(self, request: BuildRequest, log: LogWriter, stop: threading.Event) -> BuildResult:
        """Build and tag the image; the output goes to ``log``; ``stop`` aborts it.
        Raises ``BuilderUnavailable`` when the engine does not answer."""
        ...

    def usage(self, meter_name: str) -> BuildUsage:
        """What the steps of every build under ``meter_name`` consumed (None: not measured)."""
        ...

    def forget_usage(self, meter_name: str) -> None:
        """Drop what ``usage`` reads (once the build's usage is recorded)."""
        ...
