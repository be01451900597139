"""Usage read from the real engine: CPU seconds and the memory peak of what a tool did,
exact for an adopter too, and the attempt's parent cgroup gone with its container."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker
import pytest

from runyard.domain.attempt import AttemptSpec
from runyard.domain.states import RunStatus
from runyard.domain.usage import AttemptUsage
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptAbandoned, AttemptControl
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.usage_meter import CGROUP_ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MIB = 1 << 20
BURN_TWO_CPU_SECONDS = (
    "import time\nt = time.process_time()\nwhile time.process_time() - t < 2.0:\n    pass\n"
)


def python_spec(registry: ToolRegistry, program: str, *, memory_mb: int = 64) -> AttemptSpec:
    """An attempt of a tool that runs ``program`` with the base image's python, one CPU."""
    found = registry.get("shell")
    assert found is not None
    tool = {
        **found.snapshot(),
        "image": "runyard/base:latest",
        "command": ["python3", "-c", program],
        "memory_mb": memory_mb,
        "cpus": 1.0,
    }
    return AttemptSpec(
        run_id=uuid.uuid4(),
        attempt=1,
        tool=tool,
        input={},
        deadline_at=datetime.now(UTC) + timedelta(seconds=60),
    )


def usage_of_run(runner: DockerRunner, spec: AttemptSpec) -> AttemptUsage:
    result = runner.run(spec, AttemptControl())
    assert result.status is RunStatus.SUCCEEDED, result
    assert result.usage is not None
    return result.usage


def test_usage__a_tool_that_burns_two_cpu_seconds_records_two(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    spec = python_spec(registry, BURN_TWO_CPU_SECONDS)
    usage = usage_of_run(docker_runner, spec)
    assert usage.cpu_seconds == pytest.approx(2.0, abs=0.2)
    assert usage.wall_seconds >= usage.cpu_seconds - 0.2
    assert usage.net_rx_bytes is None  # no network
    docker_runner.discard(spec.run_id, spec.attempt)


def test_usage__memory_peak_is_within_ten_percent_of_what_the_tool_allocated(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    allocated = 200 * MIB
    program = f"import time\nblock = b'x' * {allocated}\ntime.sleep(2.5)\n"
    spec = python_spec(registry, program, memory_mb=400)
    usage = usage_of_run(docker_runner, spec)
    assert abs(usage.memory_peak_bytes - allocated) <= allocated * 0.10, usage
    # Sampled while it held the block: the average is the block's size, not the start's.
    assert allocated * 0.5 <= usage.memory_avg_bytes <= usage.memory_peak_bytes
    docker_runner.discard(spec.run_id, spec.attempt)


def test_usage__an_adopter_reads_the_whole_attempt_and_discard_removes_its_cgroup(
    docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = python_spec(registry, BURN_TWO_CPU_SECONDS)
    first = AttemptControl()
    abandoned = threading.Event()

    def owner_that_dies() -> None:
        try:
            DockerRunner(docker_client).run(spec, first)
        except AttemptAbandoned:
            abandoned.set()

    owner = threading.Thread(target=owner_that_dies)
    owner.start()
    threading.Timer(1.0, first.abandon.set).start()
    owner.join(timeout=30)
    assert abandoned.is_set()
    adopter = DockerRunner(docker_client)
    usage = usage_of_run(adopter, spec)
    assert usage.cpu_seconds == pytest.approx(2.0, abs=0.2)
    adopter.discard(spec.run_id, spec.attempt)
    assert not list(Path(CGROUP_ROOT).glob(f"*/runyard/{spec.container_name}"))
