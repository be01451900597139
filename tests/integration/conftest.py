"""Integration fixtures: the queue, a tool registry, and a Docker client that cleans up."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.api.client
import docker.errors
import pytest
from sqlalchemy import Engine

from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry, load_registry
from runyard.runners.docker.labels import LABEL_MANAGED
from runyard.runners.docker.leftovers import STUCK_MOUNT
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.usage_meter import CGROUP_ROOT, CgroupFigures

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def queue(engine: Engine) -> JobQueue:
    """A queue on this test's database, with a short backoff."""
    return JobQueue(engine, backoff_base_seconds=2.0, backoff_max_seconds=60.0)


@pytest.fixture(scope="session")
def registry() -> ToolRegistry:
    """The tests' registry: the shipped example tools plus test-only ones (tests/tools.toml)."""
    return load_registry(ROOT / "tests" / "tools.toml", Settings(database_url="unused"))


@pytest.fixture
def docker_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[docker.DockerClient]:
    """A Docker client; every runyard container and volume this test made is removed after.

    Only what this process created during the test is removed: another test session or a
    benchmark on the same engine keeps its own containers (a test that removed every new
    labelled container would make their runs look lost).
    """
    created: set[str] = set()
    create = docker.api.client.APIClient.create_container

    def recording_create(self: Any, *args: Any, **kwargs: Any) -> Any:
        answer = create(self, *args, **kwargs)
        if kwargs.get("name"):
            created.add(str(kwargs["name"]))
        return answer

    monkeypatch.setattr(docker.api.client.APIClient, "create_container", recording_create)
    client = docker.from_env(timeout=60)
    yield client
    label = {"label": f"{LABEL_MANAGED}=true"}
    for container in client.containers.list(all=True, filters=label, sparse=True):
        names = {name.lstrip("/") for name in container.attrs.get("Names") or []}
        if names & created:
            _quietly(functools.partial(container.remove, force=True))
    for volume in client.volumes.list(filters=label):
        if volume.name in created:  # an attempt's volume is named after its container
            _quietly(functools.partial(volume.remove, force=True))
    for name in created:  # and so is its parent cgroup (runyard.runners.docker.usage_meter)
        CgroupFigures(CGROUP_ROOT, f"/runyard/{name}").remove()
    client.close()


def _quietly(remove: Callable[[], None]) -> None:
    try:
        remove()
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        # A bind-backed volume whose container ran across a live-restored dockerd restart
        # stays "mounted" until the engine's next restart (see AttemptLeftovers._remove_volume).
        if exc.status_code != 409 and STUCK_MOUNT not in str(exc.explanation or exc):
            raise


@pytest.fixture
def docker_runner(docker_client: docker.DockerClient) -> DockerRunner:
    """The real Docker adapter."""
    return DockerRunner(docker_client)
