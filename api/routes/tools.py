"""The tool registry, as callers see it, and builds of the tools built from source."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from api.deps import PrincipalDep, Services, ServicesDep
from api.openapi import COMMON_ERRORS, problem
from api.problems import Problem
from api.schemas import BuildRequested, ToolBuildOut, ToolOut
from runyard.domain.build_ref import BuildRef
from runyard.domain.isolation import tier_of
from runyard.registry.tools import ToolSpec
from runyard.submission.request import BuildUnavailable, pinned_build_ref
from runyard.tenancy.auth import Principal, may_run

router = APIRouter(prefix="/v1/tools", tags=["tools"], responses=COMMON_ERRORS)


async def admin_principal(principal: PrincipalDep) -> Principal:
    """The caller, if it holds an admin key; 403 otherwise."""
    if not principal.admin:
        raise Problem(403, "forbidden", "building tools needs an admin key")
    return principal


AdminDep = Annotated[Principal, Depends(admin_principal)]
BUILD_ERRORS: dict[int | str, dict[str, Any]] = {
    403: problem("Only an admin key may ask for builds"),
    404: problem("No tool of that name"),
    409: problem("The tool's source cannot be used (missing, too large, a link in it)"),
    422: problem("The tool names an image: nothing to build"),
}

# How recently a worker must have been seen for its engine to get a build asked ahead of runs.
LIVE_WORKER_SECONDS = 60.0


def _current(services: Services, tool: ToolSpec) -> BuildRef | str:
    """The build a built tool's source names now, or why it cannot be used."""
    try:
        return pinned_build_ref(services.registry, tool)
    except BuildUnavailable as exc:
        return str(exc)


def _tool_out(tool: ToolSpec, build: ToolBuildOut | None) -> ToolOut:
    return ToolOut(
        name=tool.name,
        description=tool.description,
        image=build.tag if build is not None and build.tag else str(tool.image or ""),
        timeout_seconds=tool.timeout_seconds,
        memory_mb=tool.memory_mb,
        cpus=float(tool.cpus),
        pids_limit=tool.pids_limit,
        max_attempts=tool.max_attempts,
        network=tool.network,
        egress=tool.egress,
        runtime=tool.runtime,
        isolation=tier_of(tool.runtime),
        queue=tool.queue,
        max_timeout_seconds=int(tool.limit_maxima()["timeout_seconds"]),
        max_memory_mb=int(tool.limit_maxima()["memory_mb"]),
        max_cpus=float(tool.limit_maxima()["cpus"]),
        input_schema=tool.input_schema,
        build=build,
    )


@router.get("", operation_id="listTools")
def list_tools(services: ServicesDep, principal: PrincipalDep) -> list[ToolOut]:
    """Every registered tool the key may run, with its limits and input schema; a built tool
    with its current digest and its build's status on each engine."""
    tools = [t for t in services.registry.tools.values() if may_run(principal, t.name)]
    refs = {t.name: _current(services, t) for t in tools if t.build is not None}
    tags = [ref.tag for ref in refs.values() if isinstance(ref, BuildRef)]
    status = services.build_reads.by_tags(tags)
    out = []
    for tool in tools:
        ref = refs.get(tool.name)
        build = None
        if isinstance(ref, BuildRef):
            build = ToolBuildOut(tag=ref.tag, digest=ref.digest, engines=status[ref.tag])
        elif isinstance(ref, str):
            build = ToolBuildOut(tag="", digest="", engines={}, error=ref)
        out.append(_tool_out(tool, build))
    return out


@router.post("/{name}/build", operation_id="buildTool", status_code=202, responses=BUILD_ERRORS)
def build_tool(
    name: str,
    services: ServicesDep,
    admin: AdminDep,
    force: bool = Query(False, description="Build again even where the build is ready"),
) -> BuildRequested:
    """Build a tool's current source ahead of runs on every engine with a live worker of its
    queue, or again after a failure (admin). Runs of a failed digest wait again."""
    tool = services.registry.get(name)
    if tool is None:
        raise Problem(404, "tool_not_found", services.registry.unknown_tool_message(name))
    if tool.build is None:
        raise Problem(422, "not_built", f"tool {name!r} names an image; nothing to build")
    ref = _current(services, tool)
    if isinstance(ref, str):
        raise Problem(409, "build_unavailable", ref)
    done = services.builds.rebuild(
        ref.tag, tool.queue, force=force, live_seconds=LIVE_WORKER_SECONDS
    )
    return BuildRequested(tool=name, tag=ref.tag, digest=ref.digest, queued=done.again + done.made)
