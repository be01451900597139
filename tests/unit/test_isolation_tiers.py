"""Isolation tiers: a tool's tier from its runtime, the tiers an engine offers."""

from __future__ import annotations

import pytest

from runyard.domain.isolation import (
    GVISOR,
    NAMESPACES,
    engine_memory_mb,
    engine_pids_limit,
    limits_problem,
    offered_tiers,
    tier_of,
)
from runyard.platform.settings import Settings
from runyard.registry.tools import parse_registry
from runyard.runners.docker.engine_check import engine_problems


@pytest.mark.parametrize(
    ("runtime", "tier"),
    [
        (None, "namespaces"),
        ("runc", "namespaces"),
        ("io.containerd.runc.v2", "namespaces"),
        ("runsc", "gvisor"),
        ("kata", "runtime:kata"),
    ],
)
def test_tier_of__names_the_tier_of_a_runtime(runtime: str | None, tier: str):
    assert tier_of(runtime) == tier


@pytest.mark.parametrize(
    ("runtimes", "tiers"),
    [
        ([], [NAMESPACES]),
        (["runc"], [NAMESPACES]),
        (["runc", "runsc"], [NAMESPACES, GVISOR]),
        (["runsc", "kata", "io.containerd.runc.v2"], [NAMESPACES, GVISOR]),
    ],
)
def test_offered_tiers__known_tiers_the_engine_lists_weakest_first(
    runtimes: list[str], tiers: list[object]
):
    assert offered_tiers(runtimes) == tiers


@pytest.mark.parametrize(
    ("runtime", "memory_mb", "pids"),
    [(None, 64, 48), ("runc", 64, 48), ("runsc", 64 + 32, 64 + 12 * 48), ("kata", 64, 48)],
)
def test_engine_limits__gvisor_gets_its_sandbox_allowance_on_top(
    runtime: str | None, memory_mb: int, pids: int
):
    assert engine_memory_mb(64, runtime) == memory_mb
    assert engine_pids_limit(48, runtime) == pids


def test_engine_pids_limit__no_limit_stays_no_limit_for_the_check_to_refuse():
    assert engine_pids_limit(0, "runsc") == 0


@pytest.mark.parametrize(
    ("info", "refused"),
    [
        ({"SecurityOptions": ["name=seccomp,profile=default"], "CgroupVersion": "1"}, False),
        ({"SecurityOptions": ["name=rootless"], "CgroupVersion": "2"}, False),
        ({"SecurityOptions": ["name=rootless"], "CgroupVersion": "1"}, True),
        ({"SecurityOptions": ["name=rootless"]}, True),
        ({"Rootless": True, "CgroupVersion": "1"}, True),  # Podman's compatible API
        ({"Rootless": True, "CgroupVersion": "2"}, False),
        ({"Rootless": False, "CgroupVersion": "1"}, False),
    ],
)
def test_limits_problem__a_rootless_engine_on_cgroup_v1_cannot_limit(
    info: dict[str, object], refused: bool
):
    problem = limits_problem(info)
    assert (problem is not None) is refused
    if refused:
        assert problem is not None and "cannot apply memory, CPU or pids limits" in problem


class RootlessV1Engine:
    """What a rootless Podman or Docker on cgroup v1 answers to ``info``."""

    def info(self) -> dict[str, object]:
        return {
            "SecurityOptions": ["name=seccomp,profile=default"],
            "Rootless": True,
            "CgroupVersion": "1",
            "Runtimes": {"crun": {}, "runc": {}},
        }


def test_engine_problems__a_worker_refuses_an_engine_that_cannot_limit():
    tools = parse_registry(
        {"tools": {"t": {"image": "img", "command": ["true"]}}}, Settings(database_url="unused")
    )
    problems = engine_problems(RootlessV1Engine(), tools.tools.values())
    assert problems == [
        "every tool: the engine is rootless on cgroup v1: it cannot apply memory, CPU or pids "
        "limits (a rootless engine needs cgroup v2 with the controllers delegated to its user)"
    ]
