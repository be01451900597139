"""The Docker engine's identity: a random id kept inside the engine, proof against prunes,
and told apart on a host that carries a copy of another engine's marker.

The id lives in the labels of two objects named ``runyard-engine-marker``: a volume, and a
container that is created (never started) from a tiny empty image with that volume mounted.
``docker volume prune`` keeps a volume a container refers to, and ``docker container prune``
leaves the volume, which brings the container back; a process that knows the id puts either
back whenever it looks (``RECHECK_SECONDS``). Each marker also records the fingerprint of
the engine it was made on (``docker info``'s ID, data root and host name): on an engine with
another fingerprint (a cloned host, a copied data root) the id is derived from both, so two
such engines never share an id.
"""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount

from runyard.runner import RunnerUnavailable

logger = logging.getLogger(__name__)

MARKER_NAME = "runyard-engine-marker"
MARKER_IMAGE = "runyard/engine-marker:1"
LABEL_MARKER = "io.runyard.docker.engine_marker"
LABEL_ENGINE_ID = "io.runyard.engine_id"
LABEL_FINGERPRINT = "io.runyard.engine_fingerprint"
RECHECK_SECONDS = 60.0

_TRANSPORT_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


@dataclass(frozen=True)
class Marker:
    """What a marker object holds: the random id, and the fingerprint of its engine (None
    on a volume made before fingerprints were recorded)."""

    engine_id: str
    fingerprint: str | None


def engine_fingerprint(info: Mapping[str, Any]) -> str:
    """A digest of what tells this engine from a copy of it: ``docker info``'s ID, data root
    and host name (a clone keeps the first two unless its daemon key was renewed)."""
    parts = [str(info.get(key) or "") for key in ("ID", "DockerRootDir", "Name")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def resolve_engine_id(marker: Marker, fingerprint: str) -> str:
    """The marker's own id on the engine it was made on; an id derived from both elsewhere."""
    if marker.fingerprint is None or marker.fingerprint == fingerprint:
        return marker.engine_id
    return hashlib.sha256(f"{marker.engine_id}:{fingerprint}".encode()).hexdigest()[:32]


def marker_of(labels: Mapping[str, str] | None) -> Marker | None:
    """The marker in a volume's or container's labels, if they hold one."""
    engine_id = (labels or {}).get(LABEL_ENGINE_ID)
    if not engine_id:
        return None
    return Marker(str(engine_id), (labels or {}).get(LABEL_FINGERPRINT) or None)


def _empty_image() -> bytes:
    buffer = io.BytesIO()
    tarfile.open(fileobj=buffer, mode="w").close()
    return buffer.getvalue()


class EngineMarker:
    """Reads, creates and puts back the marker of one engine; thread-safe, cached."""

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        name: str = MARKER_NAME,
        image: str = MARKER_IMAGE,
        recheck_seconds: float = RECHECK_SECONDS,
    ) -> None:
        self._client = client
        self._api = client.api
        self.name = name
        self._image = image
        self._recheck = recheck_seconds
        self._lock = threading.Lock()
        self._marker: Marker | None = None
        self._engine_id: str | None = None
        self._checked = 0.0
        self._said_volume_only = False

    def engine_id(self) -> str:
        """The engine's id; a later call at most every ``recheck_seconds`` puts back a
        pruned marker (and never changes the id this process uses)."""
        with self._lock:
            if self._engine_id is None:
                try:
                    fingerprint = engine_fingerprint(self._client.info())
                    marker = self._read_or_create(fingerprint)
                except _TRANSPORT_ERRORS as exc:
                    raise RunnerUnavailable(f"cannot read the engine marker: {exc}") from exc
                self._marker = marker
                self._engine_id = resolve_engine_id(marker, fingerprint)
                self._checked = time.monotonic()
                if self._engine_id != marker.engine_id:
                    logger.warning(
                        "the engine marker was made on another engine (a cloned host or a "
                        "copied data root?): this engine gets an id of its own",
                        extra={"engine_id": self._engine_id, "marker_id": marker.engine_id},
                    )
            elif time.monotonic() - self._checked >= self._recheck:
                self._checked = time.monotonic()
                try:
                    self._put_back()
                except _TRANSPORT_ERRORS as exc:
                    logger.warning("could not check the engine marker", extra={"error": str(exc)})
            return self._engine_id

    # --- reading and creating ---

    def _read_or_create(self, fingerprint: str) -> Marker:
        """The marker the engine holds, making whatever part of it is missing."""
        found = marker_of(self._container_labels())
        if found is not None:
            return found
        labels = self._volume_labels()
        if labels is None:
            labels = self._create_volume(Marker(uuid.uuid4().hex, fingerprint))
        marker = marker_of(labels)
        if marker is None:
            raise RunnerUnavailable(f"volume {self.name} exists without an engine id")
        # A volume from before fingerprints: this engine is the one it was made on.
        return self._create_container(Marker(marker.engine_id, marker.fingerprint or fingerprint))

    def _labels(self, marker: Marker) -> dict[str, str]:
        labels = {LABEL_MARKER: self.name, LABEL_ENGINE_ID: marker.engine_id}
        if marker.fingerprint is not None:
            labels[LABEL_FINGERPRINT] = marker.fingerprint
        return labels

    def _container_labels(self) -> dict[str, str] | None:
        try:
            attrs = self._api.inspect_container(self.name)
        except docker.errors.NotFound:
            return None
        return dict(attrs.get("Config", {}).get("Labels") or {})

    def _volume_labels(self) -> dict[str, str] | None:
        try:
            attrs = self._api.inspect_volume(self.name)
        except docker.errors.NotFound:
            return None
        return dict(attrs.get("Labels") or {})

    def _create_volume(self, marker: Marker) -> dict[str, str]:
        """Create the volume; racing creators all end up reading the first one's labels."""
        try:
            self._api.create_volume(self.name, labels=self._labels(marker))
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
        labels = self._volume_labels()
        if labels is None:
            raise RunnerUnavailable(f"volume {self.name} vanished as it was made")
        return labels

    def _create_container(self, marker: Marker) -> Marker:
        """Create the never-started container that keeps the volume in use; the marker of
        whichever container exists afterwards. Without one (an engine that refuses image
        imports, say) the volume alone carries the id, as it always did."""
        try:
            self._ensure_image()
            self._api.create_container(
                self._image,
                command=["/runyard-engine-marker"],
                name=self.name,
                labels=self._labels(marker),
                network_disabled=True,
                host_config=self._api.create_host_config(
                    mounts=[Mount(target="/marker", source=self.name, type="volume")],
                    network_mode="none",
                ),
            )
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                if not self._said_volume_only:
                    self._said_volume_only = True
                    logger.warning(
                        "engine marker kept in its volume only: %s", exc, extra={"error": str(exc)}
                    )
                return marker
        return marker_of(self._container_labels()) or marker

    def _ensure_image(self) -> None:
        """An empty image (no files at all) for the marker container, imported once."""
        try:
            self._api.inspect_image(self._image)
        except docker.errors.ImageNotFound:
            repository, _, tag = self._image.rpartition(":")
            self._api.import_image_from_data(_empty_image(), repository=repository, tag=tag)

    def image(self) -> str:
        """The empty image's name, imported first if the engine lacks it (for containers that
        are created but never started, like the marker's)."""
        self._ensure_image()
        return self._image

    # --- putting back ---

    def _put_back(self) -> None:
        """Re-create a removed part of the marker with the id this process holds."""
        assert self._marker is not None
        if self._container_labels() is not None:
            return
        labels = self._volume_labels()
        if labels is None:
            labels = self._create_volume(self._marker)
            logger.warning(
                "the engine marker was removed (a prune?); put back",
                extra={"engine_id": self._engine_id},
            )
        held = marker_of(labels)
        if held is None or held.engine_id != self._marker.engine_id:
            logger.warning(
                "the engine marker now holds another id; this process keeps its own until it "
                "restarts",
                extra={"engine_id": self._engine_id},
            )
            return
        self._create_container(self._marker)
