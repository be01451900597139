"""The Docker adapter of the runner port: hardened, labelled, adoptable containers."""

from __future__ import annotations

import io
import json
import logging
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.models.containers import Container
from docker.types import LogConfig, Mount, Ulimit

from runyard.capture import HeadTailBuffer, to_text
from runyard.faults import AFTER_CREATE, crash_point
from runyard.live_logs import LogFollower
from runyard.models import RunStatus
from runyard.runner import (
    AttemptAbandoned,
    AttemptControl,
    AttemptResult,
    AttemptSpec,
    ContainerState,
    ErrorCode,
    ManagedAttempt,
    RunnerUnavailable,
    container_name,
)

logger = logging.getLogger(__name__)

LABEL_MANAGED = "io.runyard.managed"
LABEL_RUN_ID = "io.runyard.run_id"
LABEL_ATTEMPT = "io.runyard.attempt"
LABEL_TOOL = "io.runyard.tool"
LABEL_DEADLINE = "io.runyard.deadline"
ENGINE_MARKER_VOLUME = "runyard-engine-marker"
LABEL_ENGINE_ID = "io.runyard.engine_id"
WORKDIR = "/runyard"
POLL_SECONDS = 0.5
CREATED_GRACE_SECONDS = 2.0

_TRANSPORT_ERRORS = (
    docker.errors.APIError,
    docker.errors.DockerException,
    requests.exceptions.RequestException,
)


@dataclass(frozen=True)
class DockerLimits:
    """Operator-wide settings the adapter applies to every container."""

    stdout_cap_bytes: int = 1_048_576
    result_cap_bytes: int = 1_048_576
    stop_grace_seconds: float = 5.0
    api_timeout_seconds: float = 30.0


def _parse_docker_time(value: str | None) -> datetime | None:
    if not value or value.startswith("0001-"):
        return None
    # Docker reports nanoseconds; Python keeps microseconds.
    main, _, frac = value.rstrip("Z").partition(".")
    frac = (frac + "000000")[:6]
    return datetime.fromisoformat(f"{main}.{frac}+00:00")


class DockerRunner:
    """Runs attempts as containers named ``runyard-{run_id}-{attempt}`` (DESIGN §5)."""

    def __init__(self, client: docker.DockerClient, limits: DockerLimits | None = None) -> None:
        self._client = client
        self._limits = limits or DockerLimits()
        self._engine_id: str | None = None

    @classmethod
    def from_env(cls, limits: DockerLimits | None = None) -> DockerRunner:
        """Connect the standard way (``DOCKER_HOST`` or the local socket)."""
        timeout = int((limits or DockerLimits()).api_timeout_seconds)
        try:
            client = docker.from_env(timeout=timeout)
        except docker.errors.DockerException as exc:
            raise RunnerUnavailable(f"cannot reach the Docker engine: {exc}") from exc
        return cls(client, limits)

    # --- identity ---

    def engine_id(self) -> str:
        """The id stored in a labelled marker volume inside the engine, created on first use."""
        if self._engine_id is not None:
            return self._engine_id
        try:
            try:
                volume = self._client.volumes.get(ENGINE_MARKER_VOLUME)
            except docker.errors.NotFound:
                # Creating an existing volume returns it unchanged, so racing workers agree.
                self._client.volumes.create(
                    ENGINE_MARKER_VOLUME,
                    labels={LABEL_MANAGED: "true", LABEL_ENGINE_ID: uuid.uuid4().hex},
                )
                volume = self._client.volumes.get(ENGINE_MARKER_VOLUME)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read the engine marker: {exc}") from exc
        labels = volume.attrs.get("Labels") or {}
        engine_id = labels.get(LABEL_ENGINE_ID)
        if not engine_id:
            raise RunnerUnavailable(f"volume {ENGINE_MARKER_VOLUME} exists without an engine id")
        self._engine_id = str(engine_id)
        return self._engine_id

    # --- lookup ---

    def _find(self, run_id: uuid.UUID, attempt: int) -> Container | None:
        try:
            return self._client.containers.get(container_name(run_id, attempt))
        except docker.errors.NotFound:
            return None
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot inspect container: {exc}") from exc

    def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
        """Map the container's Docker state onto the runner's four states."""
        container = self._find(run_id, attempt)
        if container is None:
            return ContainerState.MISSING
        status = container.attrs["State"]["Status"]
        if status == "created":
            return ContainerState.CREATED
        if status in ("running", "paused", "restarting"):
            return ContainerState.RUNNING
        return ContainerState.EXITED

    # --- run ---

    def run(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        """Start or adopt the attempt's container, wait under its deadline, collect outputs."""
        for _ in range(3):
            container = self._settled(self._find(spec.run_id, spec.attempt))
            if container is not None:
                logger.info(
                    "adopting existing container",
                    extra={"run_id": str(spec.run_id), "attempt": spec.attempt},
                )
                return self._wait_and_collect(container, spec, control)
            prepared = self._create(spec)
            if isinstance(prepared, AttemptResult):
                return prepared
            container, created = prepared
            if not created or container is None:
                continue  # a 409: someone else's container; look at it again
            crash_point(AFTER_CREATE)
            try:
                container.start()
            except _TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot start container: {exc}") from exc
            return self._wait_and_collect(container, spec, control)
        raise RunnerUnavailable(f"could not settle on one container for {spec.container_name}")

    def _settled(self, container: Container | None) -> Container | None:
        """A started container to adopt, or None after removing one stuck in ``created``.

        A container seen in ``created`` may be about to be started by its creator, so it gets a
        short grace; if it stays there its tool never ran and a recreate is no twin.
        """
        deadline = time.monotonic() + CREATED_GRACE_SECONDS
        while container is not None and container.attrs["State"]["Status"] == "created":
            if time.monotonic() >= deadline:
                self._remove(container)
                return None
            time.sleep(0.1)
            try:
                container.reload()
            except docker.errors.NotFound:
                return None
            except _TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot inspect {container.name}: {exc}") from exc
        return container

    def _image_id(self, image: str) -> str | AttemptResult:
        try:
            return str(self._client.images.get(image).id)
        except docker.errors.ImageNotFound:
            pass
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot inspect image {image}: {exc}") from exc
        try:
            return str(self._client.images.pull(image).id)
        except docker.errors.APIError:
            return AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.IMAGE_NOT_FOUND,
                error=f"image {image!r} is not available on this engine",
            )
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot pull image {image}: {exc}") from exc

    def _create(self, spec: AttemptSpec) -> tuple[Container | None, bool] | AttemptResult:
        tool = spec.tool
        image_id = self._image_id(tool["image"])
        if isinstance(image_id, AttemptResult):
            return image_id
        name = spec.container_name
        labels = {
            LABEL_MANAGED: "true",
            LABEL_RUN_ID: str(spec.run_id),
            LABEL_ATTEMPT: str(spec.attempt),
            LABEL_TOOL: str(tool["name"]),
            LABEL_DEADLINE: spec.deadline_at.astimezone(UTC).isoformat(),
        }
        env = dict(tool.get("env") or {})
        env.update(
            {
                "RUNYARD_RUN_ID": str(spec.run_id),
                "RUNYARD_ATTEMPT": str(spec.attempt),
                "RUNYARD_INPUT": f"{WORKDIR}/input.json",
                "RUNYARD_OUTPUT_DIR": f"{WORKDIR}/out",
            }
        )
        memory = f"{int(tool['memory_mb'])}m"
        nofile = int(tool.get("nofile_limit", 1024))
        try:
            self._client.volumes.create(name, labels=labels)
            container = self._client.containers.create(
                image=image_id,
                command=list(tool["command"]),
                entrypoint=tool.get("entrypoint"),
                working_dir=tool.get("workdir"),
                name=name,
                labels=labels,
                environment=env,
                user=str(tool.get("user", "65534:65534")),
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={"/tmp": f"rw,noexec,nosuid,nodev,size={int(tool.get('tmpfs_mb', 16))}m"},
                network_mode="none",
                mem_limit=memory,
                memswap_limit=memory,
                nano_cpus=int(float(tool["cpus"]) * 1e9),
                pids_limit=int(tool["pids_limit"]),
                ulimits=[Ulimit(name="nofile", soft=nofile, hard=nofile)],
                init=True,
                privileged=False,
                mounts=[Mount(target=WORKDIR, source=name, type="volume")],
                log_config=LogConfig(type="json-file", config={"max-size": "20m", "max-file": "1"}),
                stop_signal="SIGTERM",
                detach=True,
            )
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                # The attempt's container already exists: look again, never make a twin.
                return self._find(spec.run_id, spec.attempt), False
            raise RunnerUnavailable(f"cannot create container {name}: {exc}") from exc
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot create container {name}: {exc}") from exc
        try:
            container.put_archive(WORKDIR, self._workdir_archive(spec))
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot write the input of {name}: {exc}") from exc
        return container, True

    @staticmethod
    def _workdir_archive(spec: AttemptSpec) -> bytes:
        """``input.json`` (root-owned, read-only) and ``out/`` (owned by the tool user)."""
        user = str(spec.tool.get("user", "65534:65534"))
        uid_text, _, gid_text = user.partition(":")
        uid = int(uid_text)
        gid = int(gid_text or uid_text)
        payload = json.dumps(spec.input).encode()
        now = time.time()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo("input.json")
            info.size, info.mode, info.mtime = len(payload), 0o444, now
            tar.addfile(info, io.BytesIO(payload))
            out = tarfile.TarInfo("out")
            out.type, out.mode, out.uid, out.gid, out.mtime = tarfile.DIRTYPE, 0o755, uid, gid, now
            tar.addfile(out)
        return buffer.getvalue()

    def _wait_and_collect(
        self, container: Container, spec: AttemptSpec, control: AttemptControl
    ) -> AttemptResult:
        followers: list[LogFollower] = []
        if control.logs is not None:
            cap = int(spec.tool.get("stdout_cap_bytes") or self._limits.stdout_cap_bytes)
            followers = [
                LogFollower(container, stream, control.logs, cap) for stream in ("stdout", "stderr")
            ]
            for follower in followers:
                follower.start()
        try:
            stopped_for = self._wait(container, spec, control)
        except BaseException:
            for follower in followers:
                follower.stop()
            raise
        for follower in followers:
            follower.join(timeout=5.0)
        return self._collect(container, spec, stopped_for)

    def _wait(self, container: Container, spec: AttemptSpec, control: AttemptControl) -> str | None:
        """Wait for exit; stop the container on cancel or at the deadline."""
        stopped_for: str | None = None
        while True:
            if control.abandon.is_set():
                raise AttemptAbandoned(container.name)
            if stopped_for is None and control.cancel.is_set() and self._is_running(container):
                stopped_for = ErrorCode.CANCELLED
                self._stop(container)
            elif (
                stopped_for is None
                and datetime.now(UTC) >= spec.deadline_at
                and self._is_running(container)
            ):
                # Only a container still running at its deadline is stopped for it: one an
                # adopter finds already exited keeps the outcome it finished with.
                stopped_for = ErrorCode.TIMED_OUT
                self._stop(container)
            remaining = (spec.deadline_at - datetime.now(UTC)).total_seconds()
            timeout = max(0.05, min(POLL_SECONDS, remaining)) if stopped_for is None else 1.0
            try:
                container.wait(timeout=timeout)
                break
            except requests.exceptions.ConnectionError as exc:
                if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                    raise RunnerUnavailable(f"lost the Docker engine: {exc}") from exc
            except requests.exceptions.ReadTimeout:
                continue
            except docker.errors.NotFound as exc:
                raise RunnerUnavailable(f"container {container.name} disappeared") from exc
            except _TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot wait on {container.name}: {exc}") from exc
        return stopped_for

    def _is_running(self, container: Container) -> bool:
        try:
            container.reload()
        except docker.errors.NotFound as exc:
            raise RunnerUnavailable(f"container {container.name} disappeared") from exc
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot inspect {container.name}: {exc}") from exc
        return bool(container.attrs["State"]["Status"] in ("running", "paused", "restarting"))

    def _stop(self, container: Container) -> None:
        """SIGTERM, the grace period, then SIGKILL (Docker's stop does exactly that)."""
        try:
            container.stop(timeout=int(self._limits.stop_grace_seconds))
        except docker.errors.NotFound:
            pass
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot stop {container.name}: {exc}") from exc

    def _collect(
        self, container: Container, spec: AttemptSpec, stopped_for: str | None
    ) -> AttemptResult:
        try:
            container.reload()
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot inspect {container.name}: {exc}") from exc
        state = container.attrs["State"]
        exit_code = int(state.get("ExitCode", -1))
        finished_at = _parse_docker_time(state.get("FinishedAt"))
        image_digest = str(container.attrs.get("Image") or "") or None
        cap = int(spec.tool.get("stdout_cap_bytes") or self._limits.stdout_cap_bytes)
        stdout = self._logs(container, stdout=True, cap=cap)
        stderr = self._logs(container, stdout=False, cap=cap)
        common: dict[str, Any] = {
            "exit_code": exit_code,
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "stdout_truncated": stdout.truncated,
            "stderr_truncated": stderr.truncated,
            "image_digest": image_digest,
        }
        timed_out = stopped_for == ErrorCode.TIMED_OUT or (
            finished_at is not None and finished_at >= spec.deadline_at and exit_code != 0
        )
        if stopped_for == ErrorCode.CANCELLED:
            return AttemptResult(
                status=RunStatus.CANCELLED,
                error_code=ErrorCode.CANCELLED,
                error="cancelled on request",
                **common,
            )
        if timed_out:
            timeout = int(spec.tool.get("timeout_seconds", 0))
            return AttemptResult(
                status=RunStatus.TIMED_OUT,
                error_code=ErrorCode.TIMED_OUT,
                error=f"the tool ran past its {timeout} s timeout",
                **common,
            )
        if state.get("OOMKilled"):
            return AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.OOM_KILLED,
                error=f"the tool ran out of memory ({spec.tool.get('memory_mb')} MB)",
                **common,
            )
        if exit_code != 0:
            return AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.TOOL_FAILED,
                error=f"the tool exited with code {exit_code}",
                **common,
            )
        result_cap = int(spec.tool.get("result_cap_bytes") or self._limits.result_cap_bytes)
        result, problem = self._read_result(container, result_cap)
        if problem is not None:
            return AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.INVALID_RESULT,
                error=problem,
                **common,
            )
        return AttemptResult(status=RunStatus.SUCCEEDED, result=result, **common)

    def _logs(self, container: Container, *, stdout: bool, cap: int) -> HeadTailBuffer:
        buffer = HeadTailBuffer(cap)
        try:
            chunks: Iterator[bytes] = container.logs(
                stdout=stdout, stderr=not stdout, stream=True, follow=False
            )
            for chunk in chunks:
                buffer.write(chunk)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read logs of {container.name}: {exc}") from exc
        return buffer

    def _read_result(self, container: Container, cap: int) -> tuple[Any | None, str | None]:
        """Read ``out/result.json`` as a tar stream; anything but one small regular file fails."""
        path = f"{WORKDIR}/out/result.json"
        try:
            stream, stat = container.get_archive(path)
        except docker.errors.NotFound:
            return None, None
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read the result of {container.name}: {exc}") from exc
        if stat.get("linkTarget"):
            return None, "result.json is a link; only a regular file is accepted"
        if int(stat.get("size", 0)) > cap:
            return None, f"result.json is larger than {cap} bytes"
        raw = bytearray()
        for chunk in stream:
            raw += chunk
            if len(raw) > cap + 64 * 1024:
                return None, f"result.json is larger than {cap} bytes"
        try:
            with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r:") as tar:
                members = tar.getmembers()
                if len(members) != 1:
                    return None, "result.json must be a single regular file"
                member = members[0]
                if (
                    not member.isreg()
                    or member.name != "result.json"
                    or member.name.startswith("/")
                    or ".." in member.name.split("/")
                ):
                    return None, "result.json must be a single regular file"
                if member.size > cap:
                    return None, f"result.json is larger than {cap} bytes"
                handle = tar.extractfile(member)
                data = handle.read(cap + 1) if handle is not None else b""
        except tarfile.TarError as exc:
            return None, f"result.json could not be read: {exc}"
        try:
            return json.loads(to_text(data)), None
        except ValueError as exc:
            return None, f"result.json is not valid JSON: {exc}"

    # --- cleanup ---

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot remove {container.name}: {exc}") from exc

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove the attempt's container and volume (after the terminal commit)."""
        name = container_name(run_id, attempt)
        container = self._find(run_id, attempt)
        if container is not None:
            self._remove(container)
        try:
            self._client.volumes.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot remove volume {name}: {exc}") from exc

    def managed_attempts(self) -> list[ManagedAttempt]:
        """Labelled containers, and labelled volumes left without their container."""
        selector = {"label": f"{LABEL_MANAGED}=true"}
        found: dict[tuple[uuid.UUID, int], ManagedAttempt] = {}
        try:
            containers = self._client.containers.list(all=True, filters=selector)
            volumes = self._client.volumes.list(filters=selector)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot list managed containers: {exc}") from exc
        for container in containers:
            attempt = _attempt_of(container.labels)
            if attempt is not None:
                running = container.attrs["State"]["Status"] in ("running", "paused", "restarting")
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], running)
        for volume in volumes:
            attempt = _attempt_of(volume.attrs.get("Labels") or {})
            if attempt is not None and attempt not in found:
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], False)
        return list(found.values())


def _attempt_of(labels: dict[str, str]) -> tuple[uuid.UUID, int] | None:
    try:
        return uuid.UUID(labels[LABEL_RUN_ID]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
