"""How the Docker runner reads a container's state (no engine: a stub answers inspects)."""

from __future__ import annotations

import io
import uuid
from types import SimpleNamespace
from typing import Any, cast

import docker
import pytest

from runyard.domain.states import ContainerState
from runyard.domain.usage import Counters
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.collector import LAST_ENTRIES, AttemptCollector
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


def frame(stream: int, entry: bytes) -> bytes:
    """One entry of Docker's multiplexed log stream."""
    return bytes([stream, 0, 0, 0]) + len(entry).to_bytes(4, "big") + entry


class StubLogsApi(StubApi):
    """The log endpoint of an exited container, as docker-py's low-level client reaches it."""

    def __init__(self, entries: list[tuple[int, bytes]]) -> None:
        super().__init__("exited")
        self.body = b"".join(frame(stream, entry) for stream, entry in entries)
        self.params: dict[str, Any] = {}

    def _url(self, path: str, *args: str) -> str:
        return path.format(*args)

    def _get(self, url: str, *, params: dict[str, Any], stream: bool) -> Any:
        self.params = params
        return SimpleNamespace(raw=io.BytesIO(self.body), close=lambda: None)

    def _raise_for_status(self, response: Any) -> None:
        return None


EXIT = "2026-11-26T03:24:44Z"


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        # The engine stamped the last line after the exit (it copies output asynchronously).
        ([(1, b"2026-11-26T03:24:44.5Z three\n")], "2026-11-26T03:24:44.5Z"),
        ([(1, b"2026-11-26T03:24:44.000000001Z x\n")], "2026-11-26T03:24:44.000000001Z"),
        # stdout's later-stamped line written before stderr's earlier one: the latest stamp,
        # not the last entry's.
        (
            [
                (1, b"2026-11-26T03:24:44.541956915Z one\n"),
                (1, b"2026-11-26T03:24:44.542441403Z three\n"),
                (2, b"2026-11-26T03:24:44.541956915Z two\n"),
            ],
            "2026-11-26T03:24:44.542441403Z",
        ),
        # A line longer than 16 KiB is written in pieces that all carry its first piece's
        # stamp: five of them after stderr's later line.
        (
            [(2, b"2026-11-26T03:24:44.9Z done\n")]
            + [(1, b"2026-11-26T03:24:44.8Z " + b"x" * 16_384)] * 5,
            "2026-11-26T03:24:44.9Z",
        ),
        # A piece of output with no newline, then the next entry: each frame is its own.
        (
            [(1, b"2026-11-26T03:24:44.7Z " + b"x" * 20_000), (2, b"2026-11-26T03:24:44.6Z y\n")],
            "2026-11-26T03:24:44.7Z",
        ),
        # Earlier than the exit, or no log at all: the exit time.
        ([(1, b"2026-11-26T03:24:43.9Z three\n")], EXIT),
        ([], EXIT),
    ],
)
def test_replay_stamp__never_earlier_than_any_logged_line(
    entries: list[tuple[int, bytes]], expected: str
):
    api = StubLogsApi(entries)
    assert collector_of(api).replay_stamp("c0ffee", EXIT) == expected
    assert api.params["timestamps"] == 1 and api.params["tail"] == LAST_ENTRIES
