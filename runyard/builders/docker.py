"""The Docker adapter of the builder port: the context is streamed to the engine's build API
as a tar (no file system shared with the engine), the output is followed, the deadline is
kept by cutting the connection, which ends the build on the engine."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import tarfile
import threading
import time
from collections.abc import Callable
from typing import Any

import docker
import docker.errors
import requests
import urllib3.exceptions

from runyard.builder import (
    BuilderUnavailable,
    BuildMeter,
    BuildRequest,
    BuildResult,
    LogWriter,
)
from runyard.builds.bases import BaseProblem, base_images, dockerfile_of, missing_base_message
from runyard.domain.usage import BuildUsage, Counters, build_usage_of

logger = logging.getLogger(__name__)

LABEL_BUILD = "io.runyard.build"
# How long a build's parent cgroup may stay busy (its last step dying) before it is left.
FORGET_SECONDS = 10.0
LABEL_BUILD_TOOL = "io.runyard.build.tool"
LABEL_BUILD_DIGEST = "io.runyard.build.digest"

_TRANSPORT_ERRORS = (
    docker.errors.DockerException,
    requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,
)


class DockerBuilder:
    """Builds tool images on the engine ``api`` talks to."""

    def __init__(
        self, api: docker.APIClient, *, memory_mb: int = 1024, meter: BuildMeter | None = None
    ) -> None:
        self._api = api
        self._memory = memory_mb * 1024 * 1024
        self._meter = meter

    @classmethod
    def from_env(
        cls,
        *,
        timeout_seconds: float,
        memory_mb: int,
        meter: Callable[[docker.APIClient], BuildMeter] | None = None,
    ) -> DockerBuilder:
        """Connect the standard way (``DOCKER_HOST`` or the local socket); ``meter`` makes
        the meter of the builds' steps on that connection."""
        try:
            api = docker.APIClient(timeout=int(timeout_seconds), **docker.utils.kwargs_from_env())
        except docker.errors.DockerException as exc:
            raise BuilderUnavailable(f"cannot reach the Docker engine: {exc}") from exc
        return cls(api, memory_mb=memory_mb, meter=None if meter is None else meter(api))

    def usage(self, meter_name: str) -> BuildUsage:
        """The CPU time and memory peak of the build's ``RUN`` steps, from the parent cgroup
        they ran under (this engine's classic builder honours ``cgroupparent``); the engine's
        own work (the context, the layers) is not in it. None where it cannot be read."""
        if self._meter is None or not meter_name:
            return BuildUsage()
        return build_usage_of(self._meter.read(meter_name, Counters()))

    def forget_usage(self, meter_name: str) -> None:
        """Remove the build's parent cgroup: a build cut at its deadline or stopped leaves
        its step container dying in it for a moment, so this waits a little for it."""
        if self._meter is None or not meter_name:
            return
        give_up_at = time.monotonic() + FORGET_SECONDS
        while not self._meter.forget(meter_name, quiet=True):
            if time.monotonic() >= give_up_at:
                self._meter.forget(meter_name)  # logs what keeps it
                return
            time.sleep(0.2)

    def image_id(self, tag: str) -> str | None:
        """The id of the image tagged ``tag``, or None."""
        try:
            return str(self._api.inspect_image(tag)["Id"])
        except docker.errors.ImageNotFound:
            return None
        except _TRANSPORT_ERRORS as exc:
            raise BuilderUnavailable(f"cannot inspect image {tag}: {exc}") from exc

    def _params(self, request: BuildRequest) -> dict[str, Any]:
        """The build API's query: no forced pull (a missing base never gets this far:
        ``missing_bases``), intermediate containers always removed, the build's own
        network, memory without swap, the platform's labels, and the steps under the
        build's parent cgroup where it is metered."""
        parent = None
        if self._meter is not None and request.meter_name:
            parent = self._meter.cgroup_parent(request.meter_name)
        params: dict[str, Any] = {
            "t": request.tag,
            "dockerfile": request.dockerfile,
            "rm": True,
            "forcerm": True,
            "pull": False,
            "networkmode": request.network,
            "memory": self._memory,
            "memswap": self._memory,
            "buildargs": json.dumps(dict(request.args)),
            "labels": json.dumps(
                {
                    LABEL_BUILD: "true",
                    LABEL_BUILD_TOOL: request.tool,
                    LABEL_BUILD_DIGEST: request.digest,
                }
            ),
        }
        if parent is not None:
            params["cgroupparent"] = parent
        return params

    def missing_bases(self, request: BuildRequest) -> str | None:
        """Why the build cannot start without a pull (a base image the engine lacks, or one
        that cannot be named), or None. The engine's builder pulls a missing base image
        even with ``pull`` off, so this is what keeps builds from ever pulling."""
        try:
            dockerfile = dockerfile_of(request.context, request.dockerfile)
            images = base_images(dockerfile, request.args)
        except (BaseProblem, tarfile.TarError) as exc:
            return f"cannot tell which images {request.dockerfile} builds on: {exc}"
        missing = [image for image in images if self.image_id(image) is None]
        return missing_base_message(missing) if missing else None

    def build(self, request: BuildRequest, log: LogWriter, stop: threading.Event) -> BuildResult:
        """Build and tag; ``stop`` set (or the deadline) cuts the connection. A base image
        the engine lacks fails the build at once, before the engine could pull it."""
        refused = self.missing_bases(request)
        if refused is not None:
            log(f"ERROR: {refused}\n")
            return BuildResult(error=refused)
        try:
            response = self._api._post(
                self._api._url("/build"),
                data=request.context,
                params=self._params(request),
                headers={"Content-Type": "application/tar"},
                stream=True,
                timeout=request.timeout_seconds + 60,
            )
            self._api._raise_for_status(response)
        except docker.errors.APIError as exc:
            return BuildResult(error=f"the engine refused the build: {exc.explanation or exc}")
        except _TRANSPORT_ERRORS as exc:
            raise BuilderUnavailable(f"cannot start the build: {exc}") from exc
        timed_out = threading.Event()
        cut = threading.Event()

        def watchdog() -> None:
            if not stop.wait(request.timeout_seconds):
                timed_out.set()
            if not cut.is_set():
                _shut(self._api, response)

        guard = threading.Thread(target=watchdog, name="runyard-build-deadline", daemon=True)
        guard.start()
        error: str | None = None
        try:
            for item in self._api._stream_helper(response, decode=True):
                text = _text_of(item)
                if text and not log(text):
                    stop.set()
                    break
                if "error" in item:
                    error = str(item.get("error") or "build failed").strip()
        except _TRANSPORT_ERRORS as exc:
            if not (timed_out.is_set() or stop.is_set()):
                raise BuilderUnavailable(f"the build's connection broke: {exc}") from exc
        finally:
            cut.set()
            stop.set()  # ends the watchdog
            guard.join()
            response.close()
        if timed_out.is_set():
            return BuildResult(error="timed out", timed_out=True)
        if error is not None:
            return BuildResult(error=error)
        image = self.image_id(request.tag)
        if image is None:
            return BuildResult(error="the build stopped before its image was tagged")
        return BuildResult(image_id=image)


def _text_of(item: Any) -> str:
    """The human part of one build-stream item."""
    if not isinstance(item, dict):
        return str(item)
    if "stream" in item:
        return str(item["stream"])
    if "error" in item:
        return f"ERROR: {item['error']}\n"
    if "status" in item:
        return f"{item['status']}\n"
    return ""


def _shut(api: docker.APIClient, response: requests.Response) -> None:
    """Cut the build's connection: the engine stops the build, the reader wakes up."""
    try:
        sock = api._get_raw_response_socket(response)
        # A SocketIO over the connection's socket (a plain socket on some transports).
        getattr(sock, "_sock", sock).shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError, docker.errors.DockerException) as exc:
        logger.debug("could not cut the build connection", extra={"error": str(exc)})
