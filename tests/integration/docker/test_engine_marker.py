"""The engine marker against the real engine: made once, proof against prunes, told apart
when copied. Every test uses a marker of its own name; prunes are filtered by its label, so
nothing else on the shared engine is touched."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator

import docker
import docker.errors
import pytest
from docker.types import Mount

from runyard.runners.docker.engine_marker import (
    LABEL_ENGINE_ID,
    LABEL_FINGERPRINT,
    LABEL_MARKER,
    MARKER_IMAGE,
    EngineMarker,
    Marker,
    engine_fingerprint,
    resolve_engine_id,
)
from runyard.runners.docker.runner import DockerRunner

pytestmark = pytest.mark.docker

ANOTHER_ENGINE = "0123456789abcdef"


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    client = docker.from_env(timeout=60)
    yield client
    client.close()


@pytest.fixture
def name(client: docker.DockerClient) -> Iterator[str]:
    """A marker name of this test's own; its container and volume are removed after."""
    name = f"runyard-engine-marker-test-{uuid.uuid4().hex[:12]}"
    yield name
    try:
        client.api.remove_container(name, force=True)
    except docker.errors.NotFound:
        pass
    try:
        client.api.remove_volume(name, force=True)
    except docker.errors.NotFound:
        pass


def only_mine(name: str) -> dict[str, str]:
    """A prune filter that matches this test's marker and nothing else."""
    return {"label": f"{LABEL_MARKER}={name}"}


def planted(client: docker.DockerClient, name: str, labels: dict[str, str]) -> None:
    """A marker as another engine (or an older runyard) left it."""
    client.api.create_volume(name, labels=labels)
    try:
        client.api.inspect_image(MARKER_IMAGE)
    except docker.errors.ImageNotFound:
        empty = io.BytesIO()
        tarfile.open(fileobj=empty, mode="w").close()
        repository, _, tag = MARKER_IMAGE.rpartition(":")
        client.api.import_image_from_data(empty.getvalue(), repository=repository, tag=tag)
    client.api.create_container(
        MARKER_IMAGE,
        command=["/x"],
        name=name,
        labels=labels,
        host_config=client.api.create_host_config(
            mounts=[Mount(target="/marker", source=name, type="volume")]
        ),
    )


def test_engine_marker__made_once_shared_by_every_process(client: docker.DockerClient, name: str):
    first = EngineMarker(client, name=name).engine_id()
    assert EngineMarker(client, name=name).engine_id() == first
    assert DockerRunner(client, marker=EngineMarker(client, name=name)).engine_id() == first
    assert first != client.info()["ID"]
    container = client.api.inspect_container(name)
    assert container["State"]["Status"] == "created"  # never started
    assert container["Config"]["Labels"][LABEL_ENGINE_ID] == first
    assert [m["Name"] for m in container["Mounts"]] == [name]
    assert client.api.inspect_volume(name)["Labels"][LABEL_ENGINE_ID] == first


def test_engine_marker__survives_volume_prune(client: docker.DockerClient, name: str):
    engine_id = EngineMarker(client, name=name).engine_id()
    pruned = client.api.prune_volumes(filters=only_mine(name))
    assert not pruned.get("VolumesDeleted")  # the marker container keeps it in use
    assert EngineMarker(client, name=name).engine_id() == engine_id


def test_engine_marker__survives_container_prune_and_is_put_back(
    client: docker.DockerClient, name: str
):
    engine_id = EngineMarker(client, name=name).engine_id()
    pruned = client.api.prune_containers(filters=only_mine(name))
    assert pruned["ContainersDeleted"]
    assert EngineMarker(client, name=name).engine_id() == engine_id
    assert client.api.inspect_container(name)["Config"]["Labels"][LABEL_ENGINE_ID] == engine_id


def test_engine_marker__pruned_whole_is_put_back_by_a_process_that_knows_it(
    client: docker.DockerClient, name: str
):
    running = EngineMarker(client, name=name, recheck_seconds=0)
    engine_id = running.engine_id()
    # What `docker system prune --volumes` does: stopped containers first, then volumes.
    assert client.api.prune_containers(filters=only_mine(name))["ContainersDeleted"]
    assert client.api.prune_volumes(filters=only_mine(name))["VolumesDeleted"] == [name]
    assert running.engine_id() == engine_id
    assert EngineMarker(client, name=name).engine_id() == engine_id
    assert client.api.inspect_volume(name)["Labels"][LABEL_ENGINE_ID] == engine_id


def test_engine_marker__copied_from_another_engine_gets_an_id_of_its_own(
    client: docker.DockerClient, name: str
):
    copied = uuid.uuid4().hex
    labels = {LABEL_MARKER: name, LABEL_ENGINE_ID: copied, LABEL_FINGERPRINT: ANOTHER_ENGINE}
    planted(client, name, labels)
    engine_id = EngineMarker(client, name=name).engine_id()
    assert engine_id != copied
    assert EngineMarker(client, name=name).engine_id() == engine_id  # every process agrees
    here = engine_fingerprint(client.info())
    assert engine_id == resolve_engine_id(Marker(copied, ANOTHER_ENGINE), here)
    assert client.api.inspect_container(name)["Config"]["Labels"] == labels  # left as it was


def test_engine_marker__volume_of_an_older_version_keeps_its_id(
    client: docker.DockerClient, name: str
):
    older = uuid.uuid4().hex
    client.api.create_volume(name, labels={"io.runyard.managed": "true", LABEL_ENGINE_ID: older})
    assert EngineMarker(client, name=name).engine_id() == older
    labels = client.api.inspect_container(name)["Config"]["Labels"]
    assert labels[LABEL_ENGINE_ID] == older
    assert labels[LABEL_FINGERPRINT] == engine_fingerprint(client.info())
