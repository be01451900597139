"""Isolation tiers: which kernel stands between a tool and the host, named from its runtime.

A tool's ``runtime`` (the registry's name of an OCI runtime the engine lists) decides its
tier. The tier is what callers see in ``/v1/tools`` and what ``runyard doctor`` and the
conformance suite report per engine (docs/isolation.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

RUNC = "runc"
RUNSC = "runsc"
# The names under which an engine may list the plain runc runtime.
_RUNC_NAMES = frozenset({RUNC, "io.containerd.runc.v2", "io.containerd.runtime.v1.linux"})


@dataclass(frozen=True)
class Tier:
    """One isolation tier: its name, the runtime that gives it and what it puts in the way."""

    name: str
    runtime: str
    kernel: str


NAMESPACES = Tier("namespaces", RUNC, "the host kernel, behind namespaces, cgroups and seccomp")
GVISOR = Tier("gvisor", RUNSC, "gVisor's user-space kernel (the Sentry), itself confined")
# The tiers runyard knows and proves, weakest first.
KNOWN_TIERS = (NAMESPACES, GVISOR)


def tier_of(runtime: str | None) -> str:
    """The tier of a tool whose definition names ``runtime`` (None: the engine's default,
    runc); a runtime runyard does not know is its own tier, ``runtime:<name>``."""
    if runtime is None or runtime in _RUNC_NAMES:
        return NAMESPACES.name
    for tier in KNOWN_TIERS:
        if tier.runtime == runtime:
            return tier.name
    return f"runtime:{runtime}"


def offered_tiers(engine_runtimes: Iterable[str]) -> list[Tier]:
    """The known tiers an engine listing ``engine_runtimes`` offers, weakest first (runc
    always: it is every engine's default)."""
    listed = set(engine_runtimes)
    return [tier for tier in KNOWN_TIERS if tier is NAMESPACES or tier.runtime in listed]


# gVisor's own processes (the Sentry, its gofer, and under the ptrace platform a stub per
# task) live in the container's cgroups: a tool's memory and pids limits are what the tool
# may use, so the engine is asked for the tool's limits plus this allowance. Measured with
# Debian's runsc: about 14 MB and 30 host threads for an idle sandbox, about 10 more host
# threads for each task the tool starts (docs/isolation.md).
GVISOR_MEMORY_ALLOWANCE_MB = 32
GVISOR_PIDS_BASE = 64
GVISOR_PIDS_PER_TASK = 12


def engine_memory_mb(memory_mb: int, runtime: str | None) -> int:
    """The memory limit to ask the engine for, for a tool limited to ``memory_mb``."""
    if tier_of(runtime) == GVISOR.name:
        return memory_mb + GVISOR_MEMORY_ALLOWANCE_MB
    return memory_mb


def engine_pids_limit(pids_limit: int, runtime: str | None) -> int:
    """The pids limit to ask the engine for, for a tool limited to ``pids_limit`` tasks."""
    if tier_of(runtime) == GVISOR.name and pids_limit > 0:
        return GVISOR_PIDS_BASE + GVISOR_PIDS_PER_TASK * pids_limit
    return pids_limit


def is_rootless(info: Mapping[str, Any]) -> bool:
    """Whether the engine whose ``docker info`` is ``info`` runs as an unprivileged user
    (rootless Podman says ``Rootless``; rootless Docker lists ``name=rootless`` among its
    security options)."""
    options = [str(option) for option in info.get("SecurityOptions") or []]
    return info.get("Rootless") is True or any("name=rootless" in o for o in options)


def limits_problem(info: Mapping[str, Any]) -> str | None:
    """Why an engine whose ``docker info`` is ``info`` cannot hold a tool to its memory, CPU
    and pids limits (None: it can).

    A rootless engine (rootless Podman, which says ``Rootless``; rootless Docker, which lists
    ``name=rootless`` among its security options) applies limits only through cgroup v2
    controllers delegated to its user; on cgroup v1 it starts every container without them
    and says so only in a warning.
    """
    if is_rootless(info) and str(info.get("CgroupVersion", "")) != "2":
        return (
            "the engine is rootless on cgroup v1: it cannot apply memory, CPU or pids limits "
            "(a rootless engine needs cgroup v2 with the controllers delegated to its user)"
        )
    return None
