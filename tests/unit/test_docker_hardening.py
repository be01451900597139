"""Every container's limits and hardening flags, and the check that refuses a container
without them before the engine is ever asked."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import docker
import pytest

from runyard.domain.attempt import AttemptSpec
from runyard.domain.states import ErrorCode, RunStatus
from runyard.platform.settings import Settings
from runyard.registry.tools import parse_registry
from runyard.runner import AttemptControl
from runyard.runners.docker.create_args import create_args
from runyard.runners.docker.hardening import ContainerLimits, create_problems
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.runner import DockerRunner

TOOL = {"image": "img", "command": ["true"], "cpus": 0.5, "memory_mb": 64, "pids_limit": 32}


def snapshot(**changes: Any) -> dict[str, Any]:
    registry = parse_registry({"tools": {"t": TOOL}}, Settings(database_url="unused"))
    tool = registry.get("t")
    assert tool is not None
    return {**tool.snapshot(), **changes}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, ContainerLimits(500_000_000, 64 << 20, 32, 1024, 16, 1024 << 20)),
        ({"cpus": 0.01}, ContainerLimits(10_000_000, 64 << 20, 32, 1024, 16, 1024 << 20)),
        # 1.001 * 1e9 is 1000999999.9999999 in floating point: rounded, not cut.
        ({"cpus": 1.001}, ContainerLimits(1_001_000_000, 64 << 20, 32, 1024, 16, 1024 << 20)),
        ({"cpus": 1e-10}, ContainerLimits(0, 64 << 20, 32, 1024, 16, 1024 << 20)),
        ({"cpus": float("nan")}, ContainerLimits(0, 64 << 20, 32, 1024, 16, 1024 << 20)),
        (
            {"disk_mb": 8, "tmpfs_mb": 64, "nofile_limit": 256},
            ContainerLimits(500_000_000, 64 << 20, 32, 256, 64, 64 << 20),
        ),
    ],
)
def test_container_limits__in_the_engines_units(changes: dict[str, Any], expected: Any):
    assert ContainerLimits.of(snapshot(**changes)) == expected


VOLUME = {"Target": "/runyard", "Source": "runyard-x-1", "Type": "volume"}
GOOD = {
    "NanoCpus": 500_000_000,
    "Memory": 64 << 20,
    "MemorySwap": 64 << 20,
    "PidsLimit": 32,
    "Privileged": False,
    "CapDrop": ["ALL"],
    "SecurityOpt": ["no-new-privileges"],
    "ReadonlyRootfs": True,
    "NetworkMode": "none",
    "Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=16m"},
    "Mounts": [VOLUME],
}
BIND = {"Target": "/host", "Source": "/", "Type": "bind"}


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        ({"NanoCpus": 10_000_000}, None),
        ({"NanoCpus": 0}, "no CPU limit"),
        ({"NanoCpus": None}, "no CPU limit"),
        ({"NanoCpus": 1}, "no CPU limit"),
        ({"NanoCpus": 9_999_999}, "no CPU limit"),
        ({"Memory": None}, "no memory limit"),
        ({"Memory": 4 << 20, "MemorySwap": 4 << 20}, "no memory limit"),
        ({"MemorySwap": -1}, "swap beyond the memory limit"),
        ({"PidsLimit": 0}, "no pids limit"),
        ({"PidsLimit": -1}, "no pids limit"),
        ({"PidsLimit": None}, "no pids limit"),
        ({"Privileged": True}, "privileged mode"),
        ({"CapDrop": []}, "capabilities left"),
        ({"CapAdd": ["SYS_ADMIN"]}, "capabilities left"),
        ({"SecurityOpt": []}, "no no-new-privileges"),
        ({"ReadonlyRootfs": False}, "a writable root filesystem"),
        ({"NetworkMode": "host"}, "the host's or the default network"),
        ({"NetworkMode": "default"}, "the host's or the default network"),
        ({"NetworkMode": None}, "the host's or the default network"),
        ({"NetworkMode": "bridge"}, None),
        ({"NetworkMode": "tools-net"}, None),
        ({"NetworkMode": "container:0123abcd"}, "another container's network"),
        # Confinement loosened: only no-new-privileges is ever set.
        ({"SecurityOpt": ["no-new-privileges", "seccomp=unconfined"]}, "the security option"),
        ({"SecurityOpt": ["no-new-privileges", "seccomp:unconfined"]}, "the security option"),
        ({"SecurityOpt": ["no-new-privileges", "apparmor=unconfined"]}, "the security option"),
        ({"SecurityOpt": ["no-new-privileges", "label=disable"]}, "the security option"),
        ({"SecurityOpt": ["no-new-privileges", "systempaths=unconfined"]}, "the security option"),
        (
            {"SecurityOpt": ["no-new-privileges", "no-new-privileges=false"]},
            "the security option 'no-new-privileges=false'",
        ),
        # Namespaces of the host's or another container's.
        ({"PidMode": "host"}, "the host's process namespace"),
        ({"PidMode": "container:0123abcd"}, "another container's process namespace"),
        ({"IpcMode": "host"}, "the host's IPC namespace"),
        ({"IpcMode": "container:0123abcd"}, "another container's IPC namespace"),
        ({"IpcMode": "private"}, None),
        ({"UTSMode": "host"}, "the host's UTS namespace"),
        ({"UsernsMode": "host"}, "the host's user namespace"),
        ({"CgroupnsMode": "host"}, "the host's cgroup namespace"),
        ({"CgroupnsMode": "private"}, None),
        # Host files and devices.
        ({"Binds": ["/:/host"]}, "host paths bound in"),
        ({"VolumesFrom": ["other"]}, "another container's volumes"),
        ({"Devices": [{"PathOnHost": "/dev/kmsg"}]}, "host devices"),
        ({"DeviceRequests": [{"Count": -1}]}, "host devices"),
        ({"DeviceCgroupRules": ["c 1:3 mr"]}, "host devices"),
        ({"Mounts": [VOLUME, BIND]}, "a mount beyond the work directory (bind"),
        ({"Mounts": [{**BIND, "Target": "/runyard"}]}, "a mount beyond the work directory"),
        ({"Mounts": [VOLUME, VOLUME]}, "more than one mount at /runyard"),
        ({"Mounts": None}, None),
    ],
)
def test_create_problems__a_missing_limit_or_flag_is_named(
    changes: dict[str, Any], problem: str | None
):
    config = {key: value for key, value in {**GOOD, **changes}.items() if value is not None}
    problems = create_problems(config)
    if problem is None:
        assert problems == []
    else:
        assert any(found.startswith(problem) for found in problems), problems


@pytest.mark.parametrize("cpus", [1e-10, 0.005, float("nan")])
def test_runner__refuses_a_container_without_a_cpu_limit_before_asking_the_engine(cpus: float):
    # No engine listens on this socket: any request to it would raise RunnerUnavailable.
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    runner = DockerRunner(client)
    spec = AttemptSpec(
        uuid.uuid4(), 1, snapshot(cpus=cpus), {}, datetime.now(UTC) + timedelta(seconds=30)
    )
    result = runner.run(spec, AttemptControl())
    client.close()
    assert result.status is RunStatus.FAILED
    assert result.error_code == ErrorCode.CONTAINER_REFUSED
    assert result.error is not None
    assert result.error.startswith("runyard refused to create the container")
    assert "no CPU limit" in result.error


def test_runner__the_create_arguments_of_a_valid_tool_hold_every_limit():
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    spec = AttemptSpec(uuid.uuid4(), 1, snapshot(), {}, datetime.now(UTC) + timedelta(seconds=30))
    args = create_args(client.api, spec, {}, None)
    client.close()
    assert create_problems(args["host_config"]) == []
    assert args["host_config"]["NanoCpus"] == 500_000_000


@pytest.mark.parametrize("network", ["none", "bridge", "tools-net"])
@pytest.mark.parametrize("host_workdir", [False, True])
def test_runner__create_arguments_pass_the_check_for_every_network_and_input_mode(
    network: str, host_workdir: bool, tmp_path: Path
):
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    workdirs = HostWorkdirs.open(str(tmp_path)) if host_workdir else None
    tool = snapshot(network=network, runtime="runc")
    spec = AttemptSpec(uuid.uuid4(), 1, tool, {}, datetime.now(UTC) + timedelta(seconds=30))
    args = create_args(client.api, spec, {}, workdirs)
    client.close()
    assert create_problems(args["host_config"]) == []
    assert args["host_config"]["NetworkMode"] == network
