"""Turning a caller's request into a ``NewRun`` (tool lookup, input validation, snapshot)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema

from runyard.builds.context import ContextProblem
from runyard.domain.build_ref import BuildRef
from runyard.domain.flow_limits import scopes_of
from runyard.queue import NewRun
from runyard.registry.tools import ToolRegistry, ToolSpec


class UnknownTool(Exception):
    """No tool of that name is registered."""


class ToolNotAllowed(Exception):
    """The caller's API key may not run this tool."""


class BuildUnavailable(Exception):
    """A built tool's source cannot be used (or this process cannot build tools)."""


class InvalidInput(Exception):
    """The input does not match the tool's input schema."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class AboveMaximum(InvalidInput):
    """The request asks for more than it may: a priority or a limit above its maximum."""


LIMIT_NAMES = ("timeout_seconds", "memory_mb", "cpus")


def limit_problem(
    asked: Mapping[str, float], maxima: Mapping[str, float]
) -> tuple[str, str] | None:
    """The first limit asked above its maximum, as ``(field, message)``; None if all fit."""
    for name in LIMIT_NAMES:
        value = asked.get(name)
        if value is not None and value > maxima[name]:
            return (
                f"limits.{name}",
                f"limits.{name} {value} is above this tool's maximum {maxima[name]}",
            )
    return None


def priority_problem(priority: int, max_priority: int | None) -> str | None:
    """Why ``priority`` is refused for a caller whose maximum is ``max_priority`` (None: any)."""
    if max_priority is None or priority <= max_priority:
        return None
    return f"priority {priority} is above this key's maximum {max_priority}"


MAX_RUN_AT_AHEAD = timedelta(days=30)


def run_at_problem(run_at: datetime | None, now: datetime) -> str | None:
    """Why ``run_at`` is refused: more than 30 days ahead (a past time means now)."""
    if run_at is None or run_at - now <= MAX_RUN_AT_AHEAD:
        return None
    return f"run_at {run_at.isoformat()} is more than 30 days ahead"


@dataclass(frozen=True)
class RunRequest:
    """What a caller asks for, parsed (types and bounds) but not yet checked against the
    tool registry."""

    tenant: str
    tool: str
    input: Any
    priority: int = 0
    idempotency_key: str | None = None
    callback_url: str | None = None
    # The caller's highest priority (None: any, as for admin keys).
    max_priority: int | None = None
    # The tools the caller's key may run (None: every tool).
    allowed_tools: frozenset[str] | None = None
    # Per-run limits asked for (timeout_seconds, memory_mb, cpus), within the tool's maxima.
    limits: Mapping[str, float] = field(default_factory=dict)
    # Workflows (queue mode): runs it waits for (ids, or refs of its batch), when it may start.
    depends_on: tuple[str, ...] = ()
    run_at: datetime | None = None
    rerun_of: uuid.UUID | None = None
    # Flow control: the per-key limits of its tool apply to the runs of this key.
    concurrency_key: str | None = None

    @property
    def in_graph(self) -> bool:
        """Whether it needs a graph submit (dependencies or a start time)."""
        return bool(self.depends_on) or self.run_at is not None

    def prepare(self, registry: ToolRegistry) -> NewRun:
        """Resolve the tool, check the input against its schema, snapshot its definition."""
        if self.allowed_tools is not None and self.tool not in self.allowed_tools:
            raise ToolNotAllowed(f"this API key may not run the tool {self.tool!r}")
        problem = priority_problem(self.priority, self.max_priority)
        if problem is not None:
            raise AboveMaximum(problem, "priority")
        problem = run_at_problem(self.run_at, datetime.now(UTC))
        if problem is not None:
            raise InvalidInput(problem, "run_at")
        tool = registry.get(self.tool)
        if tool is None:
            raise UnknownTool(registry.unknown_tool_message(self.tool))
        over = limit_problem(self.limits, tool.limit_maxima())
        if over is not None:
            raise AboveMaximum(over[1], over[0])
        if tool.input_schema is not None:
            validator = jsonschema.Draft202012Validator(tool.input_schema)
            error = jsonschema.exceptions.best_match(validator.iter_errors(self.input))
            if error is not None:
                path = ".".join(str(part) for part in ("input", *error.absolute_path))
                raise InvalidInput(f"{path}: {error.message}", path)
        limits = {k: v for k, v in self.limits.items() if v is not None}
        spec = {**tool.snapshot(), **limits}
        if tool.build is not None:
            spec.update(_pinned_build(registry, tool))
        return NewRun(
            tenant=self.tenant,
            tool=tool.name,
            spec=spec,
            input=self.input,
            max_attempts=tool.max_attempts,
            timeout_seconds=int(spec["timeout_seconds"]),
            queue=tool.queue,
            priority=self.priority,
            idempotency_key=self.idempotency_key,
            callback_url=self.callback_url,
            limits=limits,
            rerun_of=self.rerun_of,
            concurrency_key=self.concurrency_key,
            flow_scopes=scopes_of(
                registry.flow_config(tool), self.tenant, tool.name, self.concurrency_key
            ),
        )


def pinned_build_ref(registry: ToolRegistry, tool: ToolSpec) -> BuildRef:
    """The build a built tool's source names now (its context kept for the builders)."""
    if registry.builds is None:
        raise BuildUnavailable(f"tool {tool.name!r} is built from source; no build store here")
    try:
        return registry.builds.resolve(tool)
    except (ContextProblem, OSError) as exc:
        raise BuildUnavailable(f"tool {tool.name!r}: {exc}") from exc


def _pinned_build(registry: ToolRegistry, tool: ToolSpec) -> dict[str, Any]:
    """A built tool's image and build as its source is now: the run is pinned to them."""
    ref = pinned_build_ref(registry, tool)
    assert tool.build is not None
    return {"image": ref.tag, "build": {"context": tool.build.context, **ref.snapshot()}}


def prepare_run(
    registry: ToolRegistry,
    *,
    tenant: str,
    tool_name: str,
    input_value: Any,
    priority: int = 0,
    callback_url: str | None = None,
) -> NewRun:
    """``RunRequest.prepare`` for callers outside the API (tests, benchmarks)."""
    request = RunRequest(tenant, tool_name, input_value, priority, callback_url=callback_url)
    return request.prepare(registry)
