"""Creating and starting an attempt's container: its input written in, the engine's
refusals sorted into the run's own fault or the engine's trouble, never a twin."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors
from sqlalchemy.exc import DBAPIError

from runyard.artifact_store import ArtifactStore
from runyard.artifacts.deps_out import DepsUnusable, deps_archive, write_deps_dir
from runyard.builds.digest import is_build_tag
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import ErrorCode, RunStatus
from runyard.platform.tracing import tracing
from runyard.registry.redact import Redactor
from runyard.registry.secrets import SecretSource, SecretUnavailable
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.create_args import create_args
from runyard.runners.docker.egress import EgressGate, wants_egress
from runyard.runners.docker.engine_calls import (
    TRANSPORT_ERRORS,
    engine_message,
    inspect_container,
)
from runyard.runners.docker.hardening import WORKDIR, create_problems
from runyard.runners.docker.host_workdirs import AttemptDirs
from runyard.runners.docker.labels import LABEL_RUN_ID
from runyard.runners.docker.leftovers import AttemptLeftovers
from runyard.runners.docker.outputs import add_workdir, workdir_archive
from runyard.runners.docker.refusals import name_in_use, refused_for_settings
from runyard.runners.docker.usage_meter import UsageMeter

logger = logging.getLogger(__name__)

CREATED_GRACE_SECONDS = 2.0


class EngineRefused(Exception):
    """The engine lacks what the tool's definition names (its network or runtime)."""


class ContainerRefused(Exception):
    """The container cannot be made for the run's own settings: runyard's check of the create
    arguments refused it, or the engine did (``runyard.runners.docker.refusals``)."""


class ContainerLauncher:
    """Creates an attempt's container with its input, and starts it."""

    def __init__(
        self,
        client: docker.DockerClient,
        api: Any,
        dirs: AttemptDirs,
        secrets: SecretSource,
        egress: EgressGate,
        meter: UsageMeter,
        leftovers: AttemptLeftovers,
    ) -> None:
        self._client = client
        # The client's API, or the same with its hot calls sent over the socket directly.
        self._api = api
        self._dirs = dirs
        self._secrets = secrets
        self._egress = egress
        self._meter = meter
        self._leftovers = leftovers

    def create(self, spec: AttemptSpec, store: ArtifactStore | None) -> str | AttemptResult | None:
        """Create the container and write its input (and its dependencies' artifacts, read
        from ``store``): its id, or None if it already exists."""
        name = spec.container_name
        try:
            secrets = self._secrets.resolve(spec.tool.get("secrets") or {})
        except SecretUnavailable as exc:
            if inspect_container(self._api, name) is not None:
                return None  # made by an owner that could read them: adopt it
            return AttemptResult(
                status=RunStatus.FAILED, error_code=ErrorCode.SECRET_UNAVAILABLE, error=str(exc)
            )
        user = str(spec.tool.get("user", "65534:65534"))
        host_dir = self._dirs.inputs
        args = create_args(self._api, spec, secrets, host_dir)
        problems = create_problems(args["host_config"])
        if problems:
            # Never asked of the engine: the snapshot slipped past the bounds somehow.
            logger.error(
                "refusing to create a container without its limits",
                extra={"run_id": str(spec.run_id), "problems": problems},
            )
            return refused(
                spec,
                "runyard refused to create the container: it would have " + ", ".join(problems),
            )
        if wants_egress(spec.tool):
            self._egress.prepare(name, spec.tool, {LABEL_RUN_ID: str(spec.run_id)})
        # Asked of the engine once, and only for a container it will be asked to create.
        cgroup_parent = self._meter.cgroup_parent(name)
        if cgroup_parent is not None:
            args["host_config"]["CgroupParent"] = cgroup_parent
        fresh_dir = host_dir.prepare(name, spec.files(), user) if host_dir is not None else False
        if fresh_dir and host_dir is not None:
            try:
                self._deps_into_dir(host_dir.path(name), spec, store)
            except DepsUnusable as exc:
                self._not_ours(name, fresh_dir)
                return _deps_unusable(spec, exc)
        pulled = False
        while True:
            try:
                container_id = str(self._api.create_container(**args)["Id"])
                break
            except docker.errors.ImageNotFound as exc:
                if pulled:
                    raise RunnerUnavailable(f"image {args['image']} vanished: {exc}") from exc
                # The engine looks the image up before the name: an existing container of
                # this attempt (its tag removed since, say) is still adopted, never failed.
                if inspect_container(self._api, name) is not None:
                    self._not_ours(name, fresh_dir)
                    return None
                with tracing().span("image.pull", attributes={"runyard.image": args["image"]}):
                    failed = self._pull(str(args["image"]))
                if failed is not None:
                    return failed
                pulled = True
            except docker.errors.APIError as exc:
                if exc.status_code == 409 or name_in_use(exc.status_code, engine_message(exc)):
                    # The attempt's container already exists: look again, never make a twin.
                    self._not_ours(name, fresh_dir)
                    return None
                if exc.status_code == 400 and "runtime" in str(exc.explanation or "").lower():
                    self._not_ours(name, fresh_dir)
                    runtime = spec.tool.get("runtime")
                    return unsupported(f"the Docker engine has no runtime {runtime!r}")
                message = engine_message(exc)
                if refused_for_settings(exc.status_code, message):
                    self._not_ours(name, fresh_dir)
                    masked = Redactor(secrets.values()).text(message)
                    return refused(spec, f"the Docker engine refused the container: {masked}")
                raise RunnerUnavailable(f"cannot create container {name}: {exc}") from exc
            except TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot create container {name}: {exc}") from exc
        # Past here the container exists, unstarted: a failed run's is removed with it.
        try:
            if host_dir is not None:
                if not fresh_dir:
                    # Left by an attempt whose container is gone (a crash before its create).
                    host_dir.reset(name, spec.files(), user)
                    self._deps_into_dir(host_dir.path(name), spec, store)
                return container_id
            try:
                self._upload(container_id, spec, store, user)
            except TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot write the input of {name}: {exc}") from exc
        except DepsUnusable as exc:
            return _deps_unusable(spec, exc)
        return container_id

    def start(self, container_id: str, spec: AttemptSpec) -> bool:
        """Start the container; False if its host work directory could not be mounted (the
        engine is elsewhere): uploads are used from then on and the attempt is made again."""
        try:
            self._api.start(container_id)
            return True
        except docker.errors.NotFound as exc:
            # The network is joined at the start; a missing one is the definition's fault.
            if "network" in str(exc.explanation or ""):
                network = spec.tool.get("network")
                raise EngineRefused(f"the Docker engine has no network {network!r}") from exc
            raise RunnerUnavailable(f"cannot start container: {exc}") from exc
        except docker.errors.APIError as exc:
            if self._dirs.inputs is None or "failed to mount local volume" not in str(exc):
                message = engine_message(exc)
                if refused_for_settings(exc.status_code, message):
                    # Made but never started: removed with the run's other leftovers.
                    masked = container_redactor(self._api, container_id, spec).text(message)
                    raise ContainerRefused(
                        f"the Docker engine refused to start the container: {masked}"
                    ) from exc
                raise RunnerUnavailable(f"cannot start container: {exc}") from exc
            logger.error(
                "the Docker engine cannot see RUNYARD_HOST_WORKDIR_ROOT; uploading inputs instead",
                extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "error": str(exc)},
            )
            self._dirs.upload_from_now()
            self._leftovers.discard(spec.run_id, spec.attempt)
            return False
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot start container: {exc}") from exc

    def settled(self, attrs: dict[str, Any] | None) -> dict[str, Any] | None:
        """A started container to adopt, or None after removing one stuck in ``created``.

        A container seen in ``created`` may be about to be started by its creator, so it gets a
        short grace; if it stays there its tool never ran and a recreate is no twin.
        """
        deadline = time.monotonic() + CREATED_GRACE_SECONDS
        while attrs is not None and attrs["State"]["Status"] == "created":
            if time.monotonic() >= deadline:
                self._leftovers.remove(str(attrs["Id"]))
                return None
            time.sleep(0.1)
            attrs = inspect_container(self._api, str(attrs["Id"]))
        return attrs

    def _pull(self, image: str) -> AttemptResult | None:
        """Pull a missing image; an image the engine cannot get fails the attempt."""
        if is_build_tag(image):
            # Built by the platform, never pulled: it was removed from the engine since.
            return AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.IMAGE_NOT_FOUND,
                error=f"image {image!r} was removed from this engine; runyard build --force "
                "builds it again",
            )
        try:
            self._client.images.pull(image)
        except docker.errors.APIError:
            return AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.IMAGE_NOT_FOUND,
                error=f"image {image!r} is not available on this engine",
            )
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot pull image {image}: {exc}") from exc
        return None

    def _upload(
        self, container_id: str, spec: AttemptSpec, store: ArtifactStore | None, user: str
    ) -> None:
        """Upload ``input.json`` and ``out/``, with the dependencies' artifacts under
        ``/runyard/deps/<run id>/`` if any: one archive, since the engine re-executes itself
        to unpack each one."""
        now = time.time()
        if not spec.dep_artifacts or store is None:
            self._api.put_archive(container_id, WORKDIR, workdir_archive(spec.files(), user, now))
            return
        try:
            archive = deps_archive(
                store,
                spec.dep_artifacts,
                now,
                head=lambda tar: add_workdir(tar, spec.files(), user, now),
            )
        except (DBAPIError, DepsUnusable):
            raise  # the database's trouble (the worker classifies it), or the run's own
        except Exception as exc:  # the store's disk
            raise RunnerUnavailable(f"cannot read the dependencies' artifacts: {exc}") from exc
        assert archive is not None  # it holds the attempt's own files at least
        with archive:
            self._api.put_archive(container_id, WORKDIR, archive)

    def _deps_into_dir(self, path: Path, spec: AttemptSpec, store: ArtifactStore | None) -> None:
        """Write the dependencies' artifacts into the attempt's host work directory."""
        if not spec.dep_artifacts or store is None:
            return
        try:
            write_deps_dir(path, store, spec.dep_artifacts)
        except (DBAPIError, DepsUnusable):
            raise
        except Exception as exc:
            raise RunnerUnavailable(f"cannot write the dependencies' artifacts: {exc}") from exc

    def _not_ours(self, name: str, fresh_dir: bool) -> None:
        """The attempt's container exists already: a directory just made for it is unused."""
        if fresh_dir and self._dirs.workdirs is not None:
            self._dirs.workdirs.remove(name)


def container_redactor(api: Any, container_id: str, spec: AttemptSpec) -> Redactor:
    """The tool's secret values as the container has them (whoever resolved them)."""
    names = set(spec.tool.get("secrets") or {})
    if not names:
        return Redactor(())
    attrs = inspect_container(api, container_id)
    if attrs is None:
        raise RunnerUnavailable(f"container {spec.container_name} disappeared")
    pairs = (entry.partition("=") for entry in attrs.get("Config", {}).get("Env") or [])
    return Redactor(value for name, _, value in pairs if name in names)


def unsupported(error: str) -> AttemptResult:
    """The run's end when the engine lacks the tool's runtime or network."""
    return AttemptResult(
        status=RunStatus.FAILED, error_code=ErrorCode.ENGINE_UNSUPPORTED, error=error
    )


def refused(spec: AttemptSpec, error: str) -> AttemptResult:
    """The run's end when its container was refused for its own settings: final, at once."""
    logger.warning(
        "container refused for the run's settings",
        extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "error": error},
    )
    return AttemptResult(
        status=RunStatus.FAILED, error_code=ErrorCode.CONTAINER_REFUSED, error=error
    )


def _deps_unusable(spec: AttemptSpec, exc: DepsUnusable) -> AttemptResult:
    """The run's end when its dependencies' artifacts cannot be copied in: final, at once (a
    set whose paths clash clashes on every engine; the engine is not in trouble)."""
    logger.warning(
        "dependencies' artifacts cannot be copied in",
        extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "error": str(exc)},
    )
    return AttemptResult(
        status=RunStatus.FAILED, error_code=ErrorCode.INVALID_ARTIFACT, error=str(exc)
    )
