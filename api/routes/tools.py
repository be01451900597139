"""The tool registry, as callers see it."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import PrincipalDep, ServicesDep
from api.openapi import COMMON_ERRORS
from api.schemas import ToolOut

router = APIRouter(prefix="/v1/tools", tags=["tools"], responses=COMMON_ERRORS)


@router.get("")
def list_tools(services: ServicesDep, principal: PrincipalDep) -> list[ToolOut]:
    """Every registered tool with its limits and input schema."""
    return [
        ToolOut(
            name=tool.name,
            description=tool.description,
            image=tool.image,
            timeout_seconds=tool.timeout_seconds,
            memory_mb=tool.memory_mb,
            cpus=float(tool.cpus),
            pids_limit=tool.pids_limit,
            max_attempts=tool.max_attempts,
            network=tool.network,
            input_schema=tool.input_schema,
        )
        for tool in services.registry.tools.values()
    ]
