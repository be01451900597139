"""Integration fixtures: the queue, a tool registry, and a Docker client that cleans up."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from sqlalchemy import Engine

from runyard.docker_runner import LABEL_MANAGED, DockerRunner
from runyard.queue import JobQueue
from runyard.settings import Settings
from runyard.tools import ToolRegistry, load_registry

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
def docker_client() -> Iterator[docker.DockerClient]:
    """A Docker client; every runyard container and volume the test made is removed after."""
    client = docker.from_env(timeout=60)
    label = f"{LABEL_MANAGED}=true"
    before_c = {c.id for c in client.containers.list(all=True, filters={"label": label})}
    before_v = {v.name for v in client.volumes.list(filters={"label": label})}
    yield client
    # Another process on this engine (a second test session, a benchmark) may be creating and
    # removing its own labelled objects meanwhile: what vanished or is in use is theirs. The
    # suite-end check in tests/conftest.py still catches anything this suite leaves behind.
    for container in client.containers.list(all=True, filters={"label": label}, sparse=True):
        if container.id not in before_c:
            _quietly(functools.partial(container.remove, force=True))
    for volume in client.volumes.list(filters={"label": label}):
        if volume.name not in before_v and volume.name != "runyard-engine-marker":
            _quietly(functools.partial(volume.remove, force=True))
    client.close()


def _quietly(remove: Callable[[], None]) -> None:
    try:
        remove()
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise


@pytest.fixture
def docker_runner(docker_client: docker.DockerClient) -> DockerRunner:
    """The real Docker adapter."""
    return DockerRunner(docker_client)
