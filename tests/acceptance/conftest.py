"""Fixtures for the fault tests: a cluster on this test's database and the real engine."""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from sqlalchemy import Engine

from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.registry.tools import load_registry
from runyard.runners.docker.inputs import DEFAULT_ROOT
from runyard.runners.docker.labels import LABEL_MANAGED
from tests.acceptance.cluster import ROOT, Cluster
from tests.integration.conftest import _quietly


@pytest.fixture
def cluster(database_url: str, engine: Engine, tmp_path: Path) -> Iterator[Cluster]:
    """Worker/reaper processes started by the test; all stopped and cleaned up after."""
    with cluster_on(database_url, engine, tmp_path) as made:
        yield made


@contextlib.contextmanager
def cluster_on(database_url: str, engine: Engine, logs: Path) -> Iterator[Cluster]:
    """A cluster on the database at ``database_url``; its processes and runs' containers and
    volumes are removed at the end."""
    client = docker.from_env(timeout=60)
    registry = load_registry(ROOT / "tests" / "tools.toml", Settings(database_url="unused"))
    made = Cluster(
        database_url=database_url,
        engine=engine,
        queue=JobQueue(engine),
        registry=registry,
        logs=logs,
        docker_client=client,
    )
    try:
        yield made
    finally:
        made.close()
        runs = {str(r) for r in made.accepted}
        label = {"label": f"{LABEL_MANAGED}=true"}
        for container in client.api.containers(all=True, filters=label):
            if (container.get("Labels") or {}).get("io.runyard.run_id") in runs:
                _quietly(
                    functools.partial(client.api.remove_container, container["Id"], force=True)
                )
        for volume in client.api.volumes(filters=label).get("Volumes") or []:
            if (volume.get("Labels") or {}).get("io.runyard.run_id") in runs:
                _quietly(functools.partial(client.api.remove_volume, volume["Name"], force=True))
        # Host work directories of attempts a killed worker left (its sweep would take them).
        for run in runs:
            for directory in Path(DEFAULT_ROOT).glob(f"runyard-{run}-*"):
                shutil.rmtree(directory, ignore_errors=True)
        client.close()
