"""The pure rules of worker pools, priority maxima and per-run limits."""

from __future__ import annotations

from typing import Any

import pytest

from runyard.platform.settings import Settings
from runyard.reads.pools import unserved_queues
from runyard.registry.tools import RegistryError, parse_registry
from runyard.submission.request import limit_problem, priority_problem
from runyard.tenancy.auth import Principal, priority_ceiling

TOOL = {"image": "runyard/toolbox:latest", "command": ["true"]}
MAXIMA = {"timeout_seconds": 60, "memory_mb": 128, "cpus": 0.5}


@pytest.mark.parametrize(
    ("priority", "ceiling", "refused"),
    [(0, 0, False), (1, 0, True), (-5, 0, False), (5, 5, False), (6, 5, True), (100, None, False)],
)
def test_priority_problem__table(priority: int, ceiling: int | None, refused: bool):
    problem = priority_problem(priority, ceiling)
    assert (problem is not None) is refused
    if refused:
        assert f"maximum {ceiling}" in str(problem)


def test_priority_ceiling__admins_have_none_tenants_their_keys():
    assert priority_ceiling(Principal(tenant="ops", admin=True, max_priority=0)) is None
    assert priority_ceiling(Principal(tenant="acme", max_priority=3)) == 3


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ({}, None),
        ({"memory_mb": 128, "cpus": 0.5, "timeout_seconds": 60}, None),
        ({"memory_mb": 64}, None),
        ({"memory_mb": 129}, "limits.memory_mb"),
        ({"timeout_seconds": 61, "memory_mb": 999}, "limits.timeout_seconds"),
        ({"cpus": 0.75}, "limits.cpus"),
    ],
)
def test_limit_problem__table(asked: dict[str, float], expected: str | None):
    problem = limit_problem(asked, MAXIMA)
    assert (problem[0] if problem else None) == expected
    if problem:
        assert "maximum" in problem[1]


def test_unserved_queues__keeps_order_and_drops_served():
    assert unserved_queues(["gpu", "default", "io"], {"default": 2, "io": 0}) == ["gpu", "io"]


def test_settings__worker_queues_parse_as_names():
    settings = Settings(database_url="unused", worker_queues=" gpu, default ,gpu")
    assert settings.worker_queue_names == ("gpu", "default")
    assert Settings(database_url="unused").worker_queue_names == ("default",)
    with pytest.raises(ValueError):
        Settings(database_url="unused", worker_queues="gpu;rm")


def _registry(**tool: Any) -> Any:
    return parse_registry({"tools": {"t": {**TOOL, **tool}}}, Settings(database_url="unused"))


def test_registry__queue_and_maxima_default_to_the_tools_own_values():
    tool = _registry(memory_mb=64).get("t")
    assert tool.queue == "default"
    assert tool.limit_maxima() == {"timeout_seconds": 30, "memory_mb": 64, "cpus": 0.5}


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        ({"max_memory_mb": 999_999}, "max_memory_mb 999999 >"),
        ({"max_timeout_seconds": 10}, "max_timeout_seconds 10 < timeout_seconds 30"),
        ({"max_cpus": 64.0}, "max_cpus 64.0 >"),
        ({"queue": "no spaces"}, "queue"),
    ],
)
def test_registry__refuses_maxima_outside_the_operators(tool: dict[str, Any], problem: str):
    with pytest.raises(RegistryError, match=problem):
        _registry(**tool)
