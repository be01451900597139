"""Creating a sandbox: a run of its tool whose container is kept alive by a keeper process.

The run is submitted through the queue's one ``SUBMIT`` statement (so admission, quotas,
fair share, the claim, the lease and adoption are a run's), with a snapshot in which the
tool's command is the keeper, its silence watch is off (a sandbox's idle time is its
callers'), its timeout is the TTL, and ``sandbox_session`` tells the owner it is a sandbox.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from runyard.domain.sandboxes import MAX_EXECS_CEILING, WORKSPACE, env_problem
from runyard.queue import AdmissionCaps, ApiQueue, NewRun
from runyard.registry.tools import ToolRegistry
from runyard.sandbox_engine import KEEPER
from runyard.sandboxes.body import SESSION_KEY
from runyard.sandboxes.store import SandboxStore
from runyard.submission.request import (
    AboveMaximum,
    InvalidInput,
    ToolNotAllowed,
    UnknownTool,
    limit_problem,
)

DEFAULT_IDLE_SECONDS = 300
DEFAULT_MAX_EXECS = 4


class NotASandboxTool(Exception):
    """The tool's definition does not allow sandboxes."""


@dataclass(frozen=True)
class SandboxRequest:
    """What a caller asks for, parsed (types and bounds) but not checked against the tool."""

    tenant: str
    tool: str
    ttl_seconds: int | None = None
    idle_timeout_seconds: int | None = None
    max_execs: int | None = None
    # memory_mb and cpus, within the tool's maxima.
    limits: Mapping[str, float] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    # The tools the caller's key may run (None: every tool).
    allowed_tools: frozenset[str] | None = None
    # A retry with the same key (and request) answers the first sandbox instead of a second.
    idempotency_key: str | None = None


def prepare(request: SandboxRequest, registry: ToolRegistry, output_cap: int) -> NewRun:
    """The sandbox's run; ``UnknownTool``, ``NotASandboxTool``, ``AboveMaximum`` or
    ``InvalidInput`` if the request cannot be one, ``ToolNotAllowed`` if the key may not."""
    if request.allowed_tools is not None and request.tool not in request.allowed_tools:
        raise ToolNotAllowed(f"this API key may not run the tool {request.tool!r}")
    tool = registry.get(request.tool)
    if tool is None:
        raise UnknownTool(registry.unknown_tool_message(request.tool))
    if not tool.sandbox or tool.build is not None:
        raise NotASandboxTool(f"tool {tool.name!r} does not allow sandboxes (sandbox = true)")
    maxima = tool.limit_maxima()
    ttl = int(request.ttl_seconds or maxima["timeout_seconds"])
    limits = {k: v for k, v in request.limits.items() if v is not None}
    limits["timeout_seconds"] = ttl
    over = limit_problem(limits, maxima)
    if over is not None:
        name = "ttl_seconds" if over[0] == "limits.timeout_seconds" else over[0]
        raise AboveMaximum(over[1].replace("limits.timeout_seconds", "ttl_seconds"), name)
    idle = int(request.idle_timeout_seconds or min(DEFAULT_IDLE_SECONDS, ttl))
    problem = env_problem(dict(request.env))
    if problem is not None:
        raise InvalidInput(problem, "env")
    max_execs = int(request.max_execs or DEFAULT_MAX_EXECS)
    if not 1 <= max_execs <= MAX_EXECS_CEILING:
        raise InvalidInput(f"max_execs must be 1 to {MAX_EXECS_CEILING}", "max_execs")
    cap = int(tool.stdout_cap_bytes or output_cap)
    spec = {
        **tool.snapshot(),
        **limits,
        "entrypoint": ["/bin/sh"],
        "command": ["-c", KEEPER],
        "env": {**tool.env, **request.env, "HOME": WORKSPACE},
        "idle_timeout_seconds": None,
        SESSION_KEY: {
            "tenant": request.tenant,
            "idle_timeout_seconds": idle,
            "max_execs": max_execs,
            "output_cap_bytes": cap,
        },
    }
    return NewRun(
        tenant=request.tenant,
        tool=tool.name,
        spec=spec,
        input={},
        max_attempts=1,  # a lost sandbox is never made again, empty, under the same id
        timeout_seconds=ttl,
        queue=tool.queue,
        limits=limits,
        idempotency_key=request.idempotency_key,
    )


class Sandboxes:
    """The create use case over the queue, the registry and the sandbox rows."""

    def __init__(
        self,
        queue: ApiQueue,
        registry: ToolRegistry,
        caps: AdmissionCaps,
        store: SandboxStore,
        *,
        output_cap: int,
    ) -> None:
        self._queue = queue
        self._registry = registry
        self._caps = caps
        self._store = store
        self._output_cap = output_cap

    def create(self, request: SandboxRequest) -> uuid.UUID:
        """Submit the sandbox's run and write its row (again, for a replayed key: a create
        cut between the two still gets its row); its id. Raises what ``prepare`` and the
        queue's admission raise, ``IdempotencyConflict`` for a key used with another request."""
        run = prepare(request, self._registry, self._output_cap)
        result = self._queue.submit(run, self._caps)
        session = run.spec[SESSION_KEY]
        self._store.insert_sandbox(
            result.run_id,
            request.tenant,
            run.tool,
            int(session["idle_timeout_seconds"]),
            int(session["max_execs"]),
        )
        return result.run_id
