"""Where MCP tools come from: a list of providers, each offering some tools to a caller and
answering calls of its own tools. The server asks them in order; the first to claim a name
answers it. Today: runyard's own tools (fetching a run), sandboxes (``api.mcp.sandboxes``)
and the tool registry, each call a run. A provider of other tools is one more entry in the
list."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import mcp.types as types

from api.deps import Services
from api.mcp.answers import GET_RUN_TOOL, problem_answer
from api.mcp.runs import Progress, RunCalls
from api.mcp.sandboxes import SandboxTools
from api.problems import Problem
from runyard.registry.tools import ToolSpec
from runyard.sandboxes.files import SandboxFiles
from runyard.submission.request import RunRequest
from runyard.tenancy.auth import Principal, may_run, priority_ceiling

# The input schema of a tool that declares none: any object.
PERMISSIVE_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}
MAX_GET_RUN_WAIT = 3600


@dataclass(frozen=True)
class ToolCall:
    """One ``tools/call``: who asks, for what, under which idempotency key, and where its
    progress goes (None: the client asked for none)."""

    principal: Principal
    name: str
    arguments: dict[str, Any]
    idempotency_key: str | None = None
    progress: Progress | None = None


class ToolProvider(Protocol):
    """A source of MCP tools."""

    def tools(self, principal: Principal) -> list[types.Tool]:
        """The tools ``principal`` may call."""
        ...

    async def call(self, call: ToolCall) -> types.CallToolResult | None:
        """The answer to a call of one of this provider's tools; None if it is not one."""
        ...


def mcp_input_schema(tool: ToolSpec) -> Mapping[str, Any] | None:
    """The tool's input schema as MCP lists it; None if MCP arguments (always an object)
    could never satisfy it."""
    schema = tool.input_schema
    if schema is None:
        return PERMISSIVE_SCHEMA
    return schema if schema.get("type") == "object" else None


class RegistryTools:
    """Every registered tool the caller may run; a call is a run of it."""

    def __init__(self, services: Services, runs: RunCalls) -> None:
        self._services = services
        self._runs = runs

    def _runnable(
        self, principal: Principal, name: str
    ) -> tuple[ToolSpec, Mapping[str, Any]] | None:
        """The tool and the schema it is listed with, if ``principal`` may run it here; the
        one place that decides it (a key limited to some tools runs only those)."""
        if not may_run(principal, name):
            return None
        tool = self._services.registry.get(name)
        if tool is None:
            return None
        if tool.build is not None and self._services.sync is not None:
            return None  # built from source: its runs need queue mode
        schema = mcp_input_schema(tool)
        return None if schema is None else (tool, schema)

    def tools(self, principal: Principal) -> list[types.Tool]:
        """The registry's tools, with their descriptions and input schemas."""
        listed = []
        for name in self._services.registry.names():
            runnable = self._runnable(principal, name)
            if runnable is not None:
                tool, schema = runnable
                listed.append(
                    types.Tool(
                        name=tool.name,
                        description=tool.description or None,
                        input_schema=dict(schema),
                    )
                )
        return listed

    async def call(self, call: ToolCall) -> types.CallToolResult | None:
        """A run of the tool with the arguments as its input, under the caller's tenant."""
        if self._runnable(call.principal, call.name) is None:
            return None
        request = RunRequest(
            call.principal.tenant,
            call.name,
            call.arguments,
            idempotency_key=call.idempotency_key,
            max_priority=priority_ceiling(call.principal),
            allowed_tools=call.principal.tools,
        )
        return await self._runs.call(call.principal, request, call.progress)


GET_RUN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "run_id": {"type": "string", "format": "uuid", "description": "The run's id"},
        "wait_seconds": {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_GET_RUN_WAIT,
            "description": "Seconds to wait for the run to end (capped by the server)",
        },
    },
    "required": ["run_id"],
    "additionalProperties": False,
}


class RunyardTools:
    """runyard's own tools: fetching a run that an earlier call started."""

    def __init__(self, runs: RunCalls) -> None:
        self._runs = runs

    def tools(self, principal: Principal) -> list[types.Tool]:
        """``runyard_get_run``."""
        return [
            types.Tool(
                name=GET_RUN_TOOL,
                description="A run started by an earlier call, once it ends (or as it is "
                "after the wait): its result, or its error",
                input_schema=GET_RUN_SCHEMA,
            )
        ]

    async def call(self, call: ToolCall) -> types.CallToolResult | None:
        """The run the arguments name, if the caller may see it."""
        if call.name != GET_RUN_TOOL:
            return None
        unknown = set(call.arguments) - set(GET_RUN_SCHEMA["properties"])
        if unknown:
            field = sorted(unknown)[0]
            return problem_answer(
                Problem(422, "invalid_input", f"{field}: no such argument", field=field)
            )
        try:
            run_id = uuid.UUID(str(call.arguments.get("run_id")))
        except ValueError:
            return problem_answer(
                Problem(422, "invalid_input", "run_id: not a run id (a UUID)", field="run_id")
            )
        wait = call.arguments.get("wait_seconds", self._runs.max_wait)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait:
            return problem_answer(
                Problem(
                    422,
                    "invalid_input",
                    "wait_seconds: a number of seconds, 0 or more",
                    field="wait_seconds",
                )
            )
        return await self._runs.fetch(call.principal, run_id, float(wait), call.progress)


def default_providers(services: Services, files: Callable[[], SandboxFiles]) -> list[ToolProvider]:
    """The providers of this API: runyard's own tools first (their names win), then the
    sandbox tools (their files through ``files``), then the registry's."""
    runs = RunCalls(services)
    return [RunyardTools(runs), SandboxTools(services, files), RegistryTools(services, runs)]
