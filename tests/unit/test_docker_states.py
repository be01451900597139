"""How the Docker runner reads a container's state (no engine: a stub answers inspects)."""

from __future__ import annotations

import uuid
from typing import Any, cast

import docker
import pytest

from runyard.domain.states import ContainerState
from runyard.domain.usage import Counters
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.collector import AttemptCollector
from runyard.runners.docker.egress import EgressGate
from runyard.runners.docker.host_workdirs import AttemptDirs
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.usage_meter import UsageMeter


class StubApi:
    def __init__(self, status: str) -> None:
        self.status = status

    def inspect_container(self, ref: str) -> dict[str, Any]:
        return {
            "Id": "c0ffee",
            "Image": "sha256:1",
            "State": {"Status": self.status, "ExitCode": 137},
        }


class StubClient:
    def __init__(self, status: str) -> None:
        self.api = StubApi(status)


def runner_seeing(status: str) -> DockerRunner:
    return DockerRunner(cast(docker.DockerClient, StubClient(status)))


def collector_of(api: StubApi) -> AttemptCollector:
    return AttemptCollector(
        api,
        AttemptDirs(None),
        EgressGate(api),
        UsageMeter(api),
        stdout_cap_bytes=1_048_576,
        result_cap_bytes=1_048_576,
    )


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("created", ContainerState.CREATED),
        ("running", ContainerState.RUNNING),
        ("paused", ContainerState.RUNNING),
        ("exited", ContainerState.EXITED),
        # Being removed by someone else (or a removal that failed half-way): lost, not exited.
        ("removing", ContainerState.MISSING),
        ("dead", ContainerState.MISSING),
    ],
)
def test_state__maps_docker_statuses(status: str, expected: ContainerState):
    assert runner_seeing(status).state(uuid.uuid4(), 1) is expected


@pytest.mark.parametrize("status", ["removing", "dead"])
def test_collect__a_container_being_removed_has_no_outputs_to_trust(status: str):
    # Its logs would answer 409 or be cut short; the exit code is the remover's SIGKILL.
    with pytest.raises(RunnerUnavailable, match="disappeared"):
        collector_of(StubApi(status)).collect(
            "c0ffee",
            cast(Any, None),
            cast(Any, None),
            None,
            cast(Any, None),
            cast(Any, None),
            Counters(),
        )


class StubLogsApi(StubApi):
    def __init__(self, last_line: bytes) -> None:
        super().__init__("exited")
        self.last_line = last_line

    def logs(self, container: str, **kwargs: Any) -> bytes:
        assert kwargs == {"stdout": True, "stderr": True, "timestamps": True, "tail": 1}
        return self.last_line


@pytest.mark.parametrize(
    ("last_line", "expected"),
    [
        # The engine stamped the last line after the exit (it copies output asynchronously).
        (b"2026-11-26T03:24:44.5Z three\n", "2026-11-26T03:24:44.5Z"),
        (b"2026-11-26T03:24:44.000000001Z x\n", "2026-11-26T03:24:44.000000001Z"),
        # Earlier than the exit, or no log at all: the exit time.
        (b"2026-11-26T03:24:43.9Z three\n", "2026-11-26T03:24:44Z"),
        (b"", "2026-11-26T03:24:44Z"),
    ],
)
def test_replay_stamp__never_earlier_than_the_last_logged_line(last_line: bytes, expected: str):
    collector = collector_of(StubLogsApi(last_line))
    assert collector.replay_stamp("c0ffee", "2026-11-26T03:24:44Z") == expected
