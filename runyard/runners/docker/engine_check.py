"""Whether the engine has what the registry's tools ask for: their runtimes and networks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import docker.errors

from runyard.domain.isolation import limits_problem
from runyard.registry.tools import BRIDGE_NETWORK, NO_NETWORK, ToolSpec


def engine_problems(api: Any, tools: Iterable[ToolSpec]) -> list[str]:
    """One line per tool whose runtime or network this engine lacks (empty: all there); one
    line first if the engine cannot hold any tool to its limits."""
    tools = list(tools)
    info = api.info()
    problems: list[str] = []
    unlimited = limits_problem(info)
    if unlimited is not None and tools:
        problems.append(f"every tool: {unlimited}")
    known = set((info.get("Runtimes") or {}).keys())
    networks: dict[str, bool] = {}
    for tool in sorted(tools, key=lambda t: t.name):
        if tool.runtime is not None and tool.runtime not in known:
            problems.append(
                f"tools.{tool.name}: runtime {tool.runtime!r} is not one of the engine's "
                f"({', '.join(sorted(known)) or 'none listed'})"
            )
        network = tool.network
        if network in (NO_NETWORK, BRIDGE_NETWORK):
            continue
        if network not in networks:
            networks[network] = _network_exists(api, network)
        if not networks[network]:
            problems.append(f"tools.{tool.name}: the engine has no network {network!r}")
    return problems


def _network_exists(api: Any, name: str) -> bool:
    try:
        found = api.inspect_network(name)
    except docker.errors.NotFound:
        return False
    # The engine also finds a network by a prefix of its id: only the name counts.
    return bool(found.get("Name") == name)
