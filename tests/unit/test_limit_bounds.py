"""Every limit has a floor and a ceiling: in the registry, in a run's request, in the settings."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from api.schemas import RunCreate, RunLimits
from runyard.domain.limit_bounds import BOUNDS, MIN_CPUS, MIN_MEMORY_MB, limit_problem
from runyard.platform.settings import Settings
from runyard.registry.tools import RegistryError, ToolSpec, parse_registry

SETTINGS = Settings(database_url="unused", max_cpus=256, max_memory_mb=1_048_576)
BASE = {"image": "img", "command": ["true"]}


@pytest.mark.parametrize(
    ("name", "value", "inside"),
    [
        ("cpus", 1e-10, False),
        ("cpus", 0, False),
        ("cpus", 0.009, False),
        ("cpus", MIN_CPUS, True),
        ("cpus", 256, True),
        ("cpus", 256.5, False),
        ("cpus", math.inf, False),
        ("cpus", math.nan, False),
        ("cpus", -1, False),
        ("memory_mb", MIN_MEMORY_MB - 1, False),
        ("memory_mb", MIN_MEMORY_MB, True),
        ("memory_mb", 1_048_577, False),
        ("pids_limit", 0, False),
        ("pids_limit", 1, True),
        ("pids_limit", 65_537, False),
        ("timeout_seconds", 0, False),
        ("timeout_seconds", 604_800, True),
        ("timeout_seconds", 604_801, False),
        ("disk_mb", 0, False),
        ("tmpfs_mb", 4097, False),
        ("nofile_limit", 15, False),
        ("nofile_limit", 65_536, True),
        ("idle_timeout_seconds", 1, False),
        ("artifacts_max_mb", 0, False),
        ("stdout_cap_bytes", 1023, False),
        ("result_cap_bytes", 268_435_457, False),
    ],
)
def test_limit_problem__floor_and_ceiling_of_each_limit(name: str, value: float, inside: bool):
    problem = limit_problem(name, value)
    assert (problem is None) is inside
    if problem is not None:
        bound = BOUNDS[name]
        assert f"{bound.floor}" in problem and f"{bound.ceiling}" in problem


def test_bounds__cpu_floor_is_the_engines_minimum_never_zero():
    assert BOUNDS["cpus"].floor == 0.01 and BOUNDS["max_cpus"] is BOUNDS["cpus"]
    assert BOUNDS["memory_mb"].floor == 6


@pytest.mark.parametrize(
    ("limits", "field", "shown"),
    [
        ({"cpus": 1e-10}, "cpus", "must be from 0.01 to 256 CPUs, not 1e-10"),
        ({"cpus": 0.001}, "cpus", "must be from 0.01 to 256 CPUs, not 0.001"),
        ({"cpus": 1000.0}, "cpus", "must be from 0.01 to 256 CPUs"),
        ({"memory_mb": 5}, "memory_mb", "must be from 6 to 1048576 MB, not 5"),
        ({"timeout_seconds": 0}, "timeout_seconds", "must be from 1 to 604800 seconds"),
    ],
)
def test_run_limits__out_of_bounds_name_the_field_and_the_bounds(
    limits: dict[str, Any], field: str, shown: str
):
    with pytest.raises(ValidationError) as caught:
        RunCreate.model_validate({"tool": "echo", "limits": limits})
    [error] = caught.value.errors()
    assert error["loc"] == ("limits", field)
    assert shown in error["msg"]


def test_run_limits__bounds_are_in_the_schema_and_the_floor_is_accepted():
    assert RunLimits.model_validate({"cpus": 0.01, "memory_mb": 6}).cpus == 0.01
    schema = RunLimits.model_json_schema()["properties"]
    assert (schema["cpus"]["minimum"], schema["cpus"]["maximum"]) == (0.01, 256)
    assert schema["memory_mb"]["minimum"] == 6


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cpus", 1e-10),
        ("cpus", 0),
        ("max_cpus", 0.005),
        ("memory_mb", 4),
        ("max_memory_mb", 5),
        ("pids_limit", 0),
        ("timeout_seconds", 10**9),
        ("disk_mb", 2_000_000),
        ("tmpfs_mb", 0),
        ("nofile_limit", 1_000_000),
        ("stdout_cap_bytes", 1 << 40),
    ],
)
def test_registry__a_limit_out_of_bounds_is_an_error_naming_tool_field_and_bounds(
    key: str, value: float
):
    with pytest.raises(RegistryError) as caught:
        parse_registry({"tools": {"cheap": {**BASE, key: value}}}, SETTINGS)
    bound = BOUNDS[key]
    assert f"tools.cheap.{key}: must be from {bound.floor} to {bound.ceiling}" in str(caught.value)


def test_tool_spec__defaults_are_within_bounds():
    tool = ToolSpec.model_validate({"name": "t", **BASE})
    for name in ("cpus", "memory_mb", "pids_limit", "timeout_seconds", "disk_mb", "tmpfs_mb"):
        assert limit_problem(name, getattr(tool, name)) is None


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_cpus", 0.001),
        ("max_cpus", 1000),
        ("max_memory_mb", 5),
        ("max_pids", 0),
        ("max_timeout_seconds", 10**8),
        ("max_disk_mb", 0),
        ("max_artifacts_mb", 10**7),
        ("result_cap_bytes", 1 << 30),
    ],
)
def test_settings__operator_maxima_stay_within_the_bounds(setting: str, value: float):
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate({"database_url": "unused", setting: value})
    assert caught.value.errors()[0]["loc"] == (setting,)
