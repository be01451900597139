"""The Docker adapter of the runner port: hardened, labelled, adoptable containers."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import DriverConfig, LogConfig, Mount, Ulimit
from sqlalchemy.exc import DBAPIError

from runyard.artifact_store import CHUNK_SIZE, ArtifactStore, ArtifactWriter
from runyard.artifacts.collect import CollectError, collect_dir, collect_tar
from runyard.artifacts.deps_out import (
    DepsRoom,
    DepsUnusable,
    deps_archive,
    deps_files,
    deps_room,
    write_deps_dir,
)
from runyard.artifacts.rules import ArtifactLimits, ArtifactRefused, with_artifacts
from runyard.builds.digest import is_build_tag
from runyard.domain.attempt import AttemptResult, AttemptSpec, ManagedAttempt, container_name
from runyard.domain.outcomes import ExitFacts, StopReason, ToolLimits, decide_exit, decide_result
from runyard.domain.states import ContainerState, ErrorCode, RunStatus
from runyard.domain.tool_json import DEFAULT_MAX_DEPTH
from runyard.domain.usage import Counters, usage_of
from runyard.platform.capture import HeadTailBuffer
from runyard.platform.faults import AFTER_CREATE, crash_point
from runyard.platform.settings import Settings
from runyard.platform.tracing import parse_context, tracing
from runyard.registry.redact import Redactor
from runyard.registry.secrets import SecretSource, SecretUnavailable
from runyard.registry.tools import NO_NETWORK, ToolSpec
from runyard.runner import AttemptAbandoned, AttemptControl, LogSink, RunnerUnavailable
from runyard.runners.docker.connection import skip_environment_lookups
from runyard.runners.docker.egress import (
    EGRESS_DNS,
    EgressGate,
    egress_name,
    proxy_env,
    wants_egress,
)
from runyard.runners.docker.engine_check import engine_problems
from runyard.runners.docker.engine_marker import EngineMarker
from runyard.runners.docker.hardening import WORKDIR, ContainerLimits, create_problems
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.inputs import InputsChoice
from runyard.runners.docker.inputs import choose as choose_input_mode
from runyard.runners.docker.live_logs import LogFollower, timestamp_key
from runyard.runners.docker.outputs import (
    ContainerLogs,
    add_workdir,
    parse_result_archive,
    stat_is_link,
    stored_logs,
    workdir_archive,
)
from runyard.runners.docker.refusals import name_in_use, refused_for_settings
from runyard.runners.docker.usage_meter import Sampling, UsageMeter
from runyard.runners.docker.watch import AttemptWatch

logger = logging.getLogger(__name__)

LABEL_MANAGED = "io.runyard.managed"
LABEL_RUN_ID = "io.runyard.run_id"
LABEL_ATTEMPT = "io.runyard.attempt"
LABEL_TOOL = "io.runyard.tool"
LABEL_DEADLINE = "io.runyard.deadline"
# "host": /runyard is the attempt's host work directory, so its outputs can be read there.
LABEL_WORKDIR = "io.runyard.workdir"
SIGKILL_EXIT = 137
# How long an unexplained SIGKILL exit waits for the engine's OOM record (seconds, in steps).
OOM_EVENT_WAITS = (0.1, 0.2, 0.3, 0.4)
POLL_SECONDS = 0.5
CREATED_GRACE_SECONDS = 2.0
# Live log followers start only for attempts still running this long after their start; a
# quicker attempt's log is sent to the sink once, from the stored log (``_LiveLogs.replay``).
LIVE_LOGS_AFTER_SECONDS = 1.0
_RUNNING = ("running", "paused", "restarting")
# Someone is removing the container (or a removal failed half-way): its logs answer 409 and
# its outputs cannot be trusted, so the attempt's container counts as lost.
_GOING = ("removing", "dead")
STUCK_MOUNT = "volume has active mounts"

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


class _EngineRefused(Exception):
    """The engine lacks what the tool's definition names (its network or runtime)."""


class _ContainerRefused(Exception):
    """The container cannot be made for the run's own settings: runyard's check of the create
    arguments refused it, or the engine did (``runyard.runners.docker.refusals``)."""


def _parse_docker_time(value: str | None) -> datetime | None:
    if not value or value.startswith("0001-"):
        return None
    # Docker reports nanoseconds; Python keeps microseconds.
    main, _, frac = value.rstrip("Z").partition(".")
    frac = (frac + "000000")[:6]
    return datetime.fromisoformat(f"{main}.{frac}+00:00")


class DockerRunner:
    """Runs attempts as hardened, labelled containers (docs/runner-contract.md)."""

    def __init__(
        self,
        client: docker.DockerClient,
        limits: DockerLimits | None = None,
        workdirs: HostWorkdirs | None = None,
        marker: EngineMarker | None = None,
        secrets: SecretSource | None = None,
        egress: EgressGate | None = None,
        meter: UsageMeter | None = None,
    ) -> None:
        self._client = client
        # The networks and proxies of tools with an egress allow-list (egress.py).
        self._egress = egress or EgressGate(client.api)
        self._api = client.api
        # What each attempt's container consumes (docs/operations.md, "Usage").
        self._meter = meter or UsageMeter(client.api)
        self._limits = limits or DockerLimits()
        self._marker = marker or EngineMarker(client)
        # Values of the tools' secrets come from this process (docs/tools.md, "Secrets").
        self._secrets = secrets or SecretSource()
        # With ``workdirs`` the input is written on the host, not uploaded (host_workdirs.py).
        # ``_workdirs`` stays for the reads and the cleanup of attempts made that way, while
        # ``_input_dirs`` drops to None (uploads) for good if the engine cannot see them.
        self._workdirs = workdirs
        self._input_dirs = workdirs
        # Volumes the engine refuses to remove while it counts a mount no container holds.
        self._stuck_volumes: set[str] = set()

    @classmethod
    def from_env(
        cls, limits: DockerLimits | None = None, workdirs: HostWorkdirs | None = None
    ) -> DockerRunner:
        """Connect the standard way (``DOCKER_HOST`` or the local socket)."""
        timeout = int((limits or DockerLimits()).api_timeout_seconds)
        try:
            client = docker.from_env(timeout=timeout)
        except docker.errors.DockerException as exc:
            raise RunnerUnavailable(f"cannot reach the Docker engine: {exc}") from exc
        skip_environment_lookups(client.api)
        return cls(client, limits, workdirs)

    @classmethod
    def from_settings(cls, settings: Settings) -> DockerRunner:
        """The runner the worker and the sync-mode API use, configured by ``settings``; its
        input mode is decided here (``runyard.runners.docker.inputs``) and logged once."""
        limits = DockerLimits(
            stdout_cap_bytes=settings.stdout_cap_bytes,
            result_cap_bytes=settings.result_cap_bytes,
            stop_grace_seconds=settings.stop_grace_seconds,
            api_timeout_seconds=settings.docker_timeout_seconds,
        )
        runner = cls.from_env(limits)
        runner.choose_inputs(settings.host_workdir_root)
        return runner

    def choose_inputs(self, setting: str) -> InputsChoice:
        """Apply ``RUNYARD_HOST_WORKDIR_ROOT=setting`` (``auto`` probes the engine): host work
        directories or uploads from now on; ValueError for a forced root that cannot work."""
        workdirs, choice = choose_input_mode(setting, self._api, self._marker.image)
        self._workdirs = workdirs
        self._input_dirs = workdirs
        return choice

    @property
    def input_mode(self) -> str:
        """``host`` or ``upload``: how new attempts get their input now."""
        return "host" if self._input_dirs is not None else "upload"

    # --- identity ---

    def engine_id(self) -> str:
        """The id kept in the engine's marker (``engine_marker``), made on first use."""
        return self._marker.engine_id()

    def engine_problems(self, tools: list[ToolSpec]) -> list[str]:
        """The tools whose runtime or network this engine lacks, one line each."""
        try:
            return engine_problems(self._api, tools)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot ask the engine about runtimes: {exc}") from exc

    def ping(self) -> None:
        """Ask the engine for ``/_ping``: the cheapest call that proves it answers."""
        try:
            self._api.ping()
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"the Docker engine does not answer: {exc}") from exc

    # --- lookup ---

    def _inspect(self, ref: str) -> dict[str, Any] | None:
        """The container's inspect document, or None when there is no such container."""
        try:
            attrs: dict[str, Any] = self._api.inspect_container(ref)
        except docker.errors.NotFound:
            return None
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot inspect container {ref}: {exc}") from exc
        return attrs

    def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
        """Map the container's Docker state onto the runner's four states."""
        attrs = self._inspect(container_name(run_id, attempt))
        if attrs is None:
            return ContainerState.MISSING
        status = attrs["State"]["Status"]
        if status in _GOING:
            return ContainerState.MISSING
        if status == "created":
            return ContainerState.CREATED
        if status in _RUNNING:
            return ContainerState.RUNNING
        return ContainerState.EXITED

    # --- run ---

    def run(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        """Start or adopt the attempt's container, wait under its deadline, collect outputs.

        The create comes first: a fresh attempt (the common case) has no container yet, and
        an existing one answers 409, which sends us to inspect and adopt it, never to a twin.
        """
        for _ in range(3):
            _fence(control, spec)
            with tracing().span("container.create"):
                created = self._create(spec, control.artifacts)
            if isinstance(created, AttemptResult):
                return created
            if created is not None:
                crash_point(AFTER_CREATE)
                # Left unstarted, the next owner removes it after a grace and creates anew.
                _fence(control, spec)
                try:
                    with tracing().span("container.start"):
                        started = self._start(created, spec)
                    if not started:
                        continue
                except _EngineRefused as exc:
                    return _unsupported(str(exc))
                except _ContainerRefused as exc:
                    return _refused(spec, str(exc))
                return self._wait_and_collect(created, spec, control, started_here=True)
            attrs = self._settled(self._inspect(spec.container_name))
            if attrs is not None:
                logger.info(
                    "adopting existing container",
                    extra={"run_id": str(spec.run_id), "attempt": spec.attempt},
                )
                _link_creator(attrs)
                return self._wait_and_collect(str(attrs["Id"]), spec, control, started_here=False)
        raise RunnerUnavailable(f"could not settle on one container for {spec.container_name}")

    def _start(self, container_id: str, spec: AttemptSpec) -> bool:
        """Start the container; False if its host work directory could not be mounted (the
        engine is elsewhere): uploads are used from then on and the attempt is made again."""
        try:
            self._api.start(container_id)
            return True
        except docker.errors.NotFound as exc:
            # The network is joined at the start; a missing one is the definition's fault.
            if "network" in str(exc.explanation or ""):
                network = spec.tool.get("network")
                raise _EngineRefused(f"the Docker engine has no network {network!r}") from exc
            raise RunnerUnavailable(f"cannot start container: {exc}") from exc
        except docker.errors.APIError as exc:
            if self._input_dirs is None or "failed to mount local volume" not in str(exc):
                message = _engine_message(exc)
                if refused_for_settings(exc.status_code, message):
                    # Made but never started: removed with the run's other leftovers.
                    masked = self._redactor(container_id, spec).text(message)
                    raise _ContainerRefused(
                        f"the Docker engine refused to start the container: {masked}"
                    ) from exc
                raise RunnerUnavailable(f"cannot start container: {exc}") from exc
            logger.error(
                "the Docker engine cannot see RUNYARD_HOST_WORKDIR_ROOT; uploading inputs instead",
                extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "error": str(exc)},
            )
            self._input_dirs = None
            self.discard(spec.run_id, spec.attempt)
            return False
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot start container: {exc}") from exc

    def _settled(self, attrs: dict[str, Any] | None) -> dict[str, Any] | None:
        """A started container to adopt, or None after removing one stuck in ``created``.

        A container seen in ``created`` may be about to be started by its creator, so it gets a
        short grace; if it stays there its tool never ran and a recreate is no twin.
        """
        deadline = time.monotonic() + CREATED_GRACE_SECONDS
        while attrs is not None and attrs["State"]["Status"] == "created":
            if time.monotonic() >= deadline:
                self._remove(str(attrs["Id"]))
                return None
            time.sleep(0.1)
            attrs = self._inspect(str(attrs["Id"]))
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
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot pull image {image}: {exc}") from exc
        return None

    def _create_args(self, spec: AttemptSpec, secrets: dict[str, str]) -> dict[str, Any]:
        """The container's configuration: the contract's labels, env and hardening flags."""
        tool = spec.tool
        name = spec.container_name
        labels = {
            LABEL_MANAGED: "true",
            LABEL_RUN_ID: str(spec.run_id),
            LABEL_ATTEMPT: str(spec.attempt),
            LABEL_TOOL: str(tool["name"]),
            LABEL_DEADLINE: spec.deadline_at.astimezone(UTC).isoformat(),
        }
        if self._input_dirs is not None:
            labels[LABEL_WORKDIR] = "host"
        env = dict(tool.get("env") or {})
        env.update(secrets)
        env.update(
            {
                "RUNYARD_RUN_ID": str(spec.run_id),
                "RUNYARD_ATTEMPT": str(spec.attempt),
                "RUNYARD_INPUT": f"{WORKDIR}/input.json",
                "RUNYARD_OUTPUT_DIR": f"{WORKDIR}/out",
            }
        )
        if spec.deps is not None:
            env["RUNYARD_DEPS"] = f"{WORKDIR}/deps.json"
        network = str(tool.get("network") or NO_NETWORK)
        dns = None
        if wants_egress(tool):
            network = egress_name(name)
            env.update(proxy_env(name))
            dns = EGRESS_DNS
        if spec.traceparent:
            # The tool's own spans join the attempt's trace (W3C trace context).
            env["TRACEPARENT"] = spec.traceparent
            if spec.tracestate:
                env["TRACESTATE"] = spec.tracestate
        limits = ContainerLimits.of(tool)
        host_config = self._api.create_host_config(
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={"/tmp": f"rw,noexec,nosuid,nodev,size={limits.tmpfs_mb}m"},
            network_mode=network,
            dns=dns,
            runtime=tool.get("runtime"),
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,
            nano_cpus=limits.nano_cpus,
            pids_limit=limits.pids,
            ulimits=[
                Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
                Ulimit(name="fsize", soft=limits.fsize_bytes, hard=limits.fsize_bytes),
            ],
            init=True,
            privileged=False,
            # The engine creates the named volume, labelled, with the container: one request
            # fewer than creating it first, and a 409 leaves the existing one untouched.
            mounts=[self._workdir_mount(name, labels)],
            log_config=LogConfig(type="json-file", config={"max-size": "20m", "max-file": "1"}),
        )
        return {
            "image": tool["image"],
            "command": list(tool["command"]),
            "entrypoint": tool.get("entrypoint"),
            "working_dir": tool.get("workdir"),
            "name": name,
            "labels": labels,
            "environment": env,
            "user": str(tool.get("user", "65534:65534")),
            "stop_signal": "SIGTERM",
            "detach": True,
            "host_config": host_config,
        }

    def _workdir_mount(self, name: str, labels: dict[str, str]) -> Mount:
        """``/runyard``: the attempt's named volume, backed by its host directory if any."""
        driver = None
        if self._input_dirs is not None:
            driver = DriverConfig("local", self._input_dirs.volume_options(name))
        return Mount(
            target=WORKDIR, source=name, type="volume", labels=labels, driver_config=driver
        )

    def _create(self, spec: AttemptSpec, store: ArtifactStore | None) -> str | AttemptResult | None:
        """Create the container and write its input (and its dependencies' artifacts, read
        from ``store``): its id, or None if it already exists."""
        name = spec.container_name
        try:
            secrets = self._secrets.resolve(spec.tool.get("secrets") or {})
        except SecretUnavailable as exc:
            if self._inspect(name) is not None:
                return None  # made by an owner that could read them: adopt it
            return AttemptResult(
                status=RunStatus.FAILED, error_code=ErrorCode.SECRET_UNAVAILABLE, error=str(exc)
            )
        user = str(spec.tool.get("user", "65534:65534"))
        host_dir = self._input_dirs
        args = self._create_args(spec, secrets)
        problems = create_problems(args["host_config"])
        if problems:
            # Never asked of the engine: the snapshot slipped past the bounds somehow.
            logger.error(
                "refusing to create a container without its limits",
                extra={"run_id": str(spec.run_id), "problems": problems},
            )
            return _refused(
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
                if self._inspect(name) is not None:
                    self._not_ours(name, fresh_dir)
                    return None
                with tracing().span("image.pull", attributes={"runyard.image": args["image"]}):
                    failed = self._pull(str(args["image"]))
                if failed is not None:
                    return failed
                pulled = True
            except docker.errors.APIError as exc:
                if exc.status_code == 409 or name_in_use(exc.status_code, _engine_message(exc)):
                    # The attempt's container already exists: look again, never make a twin.
                    self._not_ours(name, fresh_dir)
                    return None
                if exc.status_code == 400 and "runtime" in str(exc.explanation or "").lower():
                    self._not_ours(name, fresh_dir)
                    runtime = spec.tool.get("runtime")
                    return _unsupported(f"the Docker engine has no runtime {runtime!r}")
                message = _engine_message(exc)
                if refused_for_settings(exc.status_code, message):
                    self._not_ours(name, fresh_dir)
                    masked = Redactor(secrets.values()).text(message)
                    return _refused(spec, f"the Docker engine refused the container: {masked}")
                raise RunnerUnavailable(f"cannot create container {name}: {exc}") from exc
            except _TRANSPORT_ERRORS as exc:
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
            except _TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot write the input of {name}: {exc}") from exc
        except DepsUnusable as exc:
            return _deps_unusable(spec, exc)
        return container_id

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
        if fresh_dir and self._workdirs is not None:
            self._workdirs.remove(name)

    def _wait_and_collect(
        self, container_id: str, spec: AttemptSpec, control: AttemptControl, *, started_here: bool
    ) -> AttemptResult:
        cap = int(spec.tool.get("stdout_cap_bytes") or self._limits.stdout_cap_bytes)
        redactor = self._redactor(container_id, spec)
        live = _LiveLogs(ContainerLogs(self._api, container_id), control.logs, cap, redactor)
        if not started_here:
            live.start()  # the previous owner was streaming: carry on at once
        watch = self._watch(container_id, spec, control)
        sampling = self._sample(container_id, spec)
        try:
            with tracing().span("container.wait", attributes={"runyard.adopted": not started_here}):
                stopped_for = self._wait(container_id, spec, control, live, watch)
        except BaseException:
            live.stop()
            sampling.stop()
            raise
        live.join()
        sampled = sampling.stop()
        with tracing().span("outputs.collect"):
            return self._collect(container_id, spec, control, stopped_for, live, watch, sampled)

    def _sample(self, container_id: str, spec: AttemptSpec) -> Sampling:
        """Sample the running container's usage; a networked tool's network from its pid."""
        networked = str(spec.tool.get("network") or NO_NETWORK) != NO_NETWORK
        pid = None
        if networked:
            attrs = self._inspect(container_id) or {}
            pid = int((attrs.get("State") or {}).get("Pid") or 0) or None
        return self._meter.follow(container_id, spec.container_name, pid, networked)

    def _redactor(self, container_id: str, spec: AttemptSpec) -> Redactor:
        """The tool's secret values as the container has them (whoever resolved them)."""
        names = set(spec.tool.get("secrets") or {})
        if not names:
            return Redactor(())
        attrs = self._inspect(container_id)
        if attrs is None:
            raise RunnerUnavailable(f"container {spec.container_name} disappeared")
        pairs = (entry.partition("=") for entry in attrs.get("Config", {}).get("Env") or [])
        return Redactor(value for name, _, value in pairs if name in names)

    def _wait(
        self,
        container_id: str,
        spec: AttemptSpec,
        control: AttemptControl,
        live: _LiveLogs,
        watch: AttemptWatch,
    ) -> StopReason | None:
        """Wait for exit; stop the container on cancel, at the deadline, when it goes quiet
        for its idle limit, or kill it when it writes past its disk limit."""
        stopped_for: StopReason | None = None
        follow_at = time.monotonic() + LIVE_LOGS_AFTER_SECONDS
        first = True
        while True:
            if control.abandon.is_set():
                raise AttemptAbandoned(spec.container_name)
            if stopped_for is None and not first:
                stopped_for = self._check_running(container_id, spec, control, watch)
            first = False
            now = time.monotonic()
            if now >= follow_at:
                live.start()
            remaining = (spec.deadline_at - control.clock()).total_seconds()
            timeout = max(0.05, min(POLL_SECONDS, remaining)) if stopped_for is None else 1.0
            if not live.started:
                timeout = min(timeout, max(0.05, follow_at - now))
            try:
                self._api.wait(container_id, timeout=timeout)
                break
            except requests.exceptions.ConnectionError as exc:
                if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                    raise RunnerUnavailable(f"lost the Docker engine: {exc}") from exc
            except requests.exceptions.ReadTimeout:
                continue
            except docker.errors.NotFound as exc:
                raise RunnerUnavailable(f"container {spec.container_name} disappeared") from exc
            except _TRANSPORT_ERRORS as exc:
                raise RunnerUnavailable(f"cannot wait on {spec.container_name}: {exc}") from exc
        return stopped_for

    def _check_running(
        self, container_id: str, spec: AttemptSpec, control: AttemptControl, watch: AttemptWatch
    ) -> StopReason | None:
        """One round of the owner's checks on a container that was running a poll ago."""
        reason: StopReason | None = None
        if control.cancel.is_set():
            reason = StopReason.CANCELLED
        elif control.clock() >= spec.deadline_at:
            # Only a container still running at its deadline is stopped for it: one an
            # adopter finds already exited keeps the outcome it finished with.
            reason = StopReason.TIMED_OUT
        else:
            reason = watch.check()
        if reason is None or not self._is_running(container_id):
            return None
        if reason is StopReason.DISK:
            # No grace for a disk fill: every second of it is more of the host's disk.
            self._kill(container_id)
        else:
            self._stop(container_id)
        logger.info(
            "stopping container",
            extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "reason": str(reason)},
        )
        return reason

    def _replay_stamp(self, container_id: str, finished_text: str) -> str:
        """The later of the exit time and the last log line's engine timestamp: under load
        the engine stamps a line when it copies it, which can be after the exit."""
        last = self.last_log_stamp(container_id)
        if last is None:
            return finished_text
        return max(finished_text, last, key=timestamp_key)

    def _watch(self, container_id: str, spec: AttemptSpec, control: AttemptControl) -> AttemptWatch:
        """The disk and idle watches of an attempt; what they look at is found on first use."""
        found: dict[str, Any] = {}

        def attrs() -> dict[str, Any]:
            if not found:
                found.update(self._inspect(container_id) or {"Config": {}})
            return found

        def workdir() -> Path | None:
            labels = attrs().get("Config", {}).get("Labels") or {}
            return self.workdir_path(container_id, spec.container_name, labels)

        def output_marker() -> object:
            return self.output_marker(container_id, attrs().get("LogPath"))

        return AttemptWatch(
            ToolLimits.of(spec.tool),
            workdir=workdir,
            output_marker=output_marker,
            note=control.note,
            log_extra={"run_id": str(spec.run_id), "attempt": spec.attempt},
            deps_room=lambda: _deps_room(spec, control.artifacts),
        )

    def output_marker(self, container_id: str, log_path: str | None) -> object:
        """Something that changes whenever the container prints: the log file's size and
        time where this host sees it, else the engine's last log entry (stamp and bytes;
        output without newlines keeps one stamp, so the bytes are part of it)."""
        if log_path:
            try:
                info = os.stat(log_path)
                return (info.st_ino, info.st_size, info.st_mtime_ns)
            except OSError:
                pass
        try:
            return bytes(
                self._api.logs(container_id, stdout=True, stderr=True, timestamps=True, tail=1)
            )
        except _TRANSPORT_ERRORS:
            return None

    def last_log_stamp(self, container_id: str) -> str | None:
        """The engine timestamp of the container's last log entry, if it has one."""
        try:
            raw = self._api.logs(container_id, stdout=True, stderr=True, timestamps=True, tail=1)
        except _TRANSPORT_ERRORS:
            return None
        last = bytes(raw).split(b" ", 1)[0].decode("ascii", errors="replace").strip()
        if not last or not last[:4].isdigit():
            return None
        return last

    def workdir_path(self, container_id: str, name: str, labels: dict[str, str]) -> Path | None:
        """Where this host sees the attempt's /runyard, or None (the engine is elsewhere)."""
        host_dir = self._host_dir(name, labels)
        if host_dir is not None:
            return host_dir
        try:
            mountpoint = self._api.inspect_volume(name).get("Mountpoint")
        except _TRANSPORT_ERRORS:
            return None
        if not mountpoint or not os.access(mountpoint, os.R_OK | os.X_OK):
            return None
        return Path(mountpoint)

    def _host_dir(self, name: str, labels: dict[str, str]) -> Path | None:
        """The attempt's host work directory if it was made that way under this runner's root;
        None otherwise (uploaded, or made under another root by a worker configured
        differently): its outputs are then read through the engine, which works for both."""
        if self._workdirs is None or labels.get(LABEL_WORKDIR) != "host":
            return None
        path = self._workdirs.path(name)
        return path if path.is_dir() else None

    def _is_running(self, container_id: str) -> bool:
        attrs = self._inspect(container_id)
        if attrs is None:
            raise RunnerUnavailable(f"container {container_id} disappeared")
        return bool(attrs["State"]["Status"] in _RUNNING)

    def _stop(self, container_id: str) -> None:
        """SIGTERM, the grace period, then SIGKILL (Docker's stop does exactly that)."""
        grace = int(self._limits.stop_grace_seconds)
        _unless_gone(lambda: self._api.stop(container_id, timeout=grace), f"stop {container_id}")

    def _kill(self, container_id: str) -> None:
        """SIGKILL at once; a container that has just exited is fine."""
        try:
            self._api.kill(container_id)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # not running any more
                raise RunnerUnavailable(f"cannot kill {container_id}: {exc}") from exc
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot kill {container_id}: {exc}") from exc

    def _exited_attrs(self, container_id: str, stopped_for: StopReason | None) -> dict[str, Any]:
        """The exited container's inspect document. A SIGKILL nobody here sent may be the
        kernel's OOM killer, whose event the engine can record just after the exit: such an
        exit is looked at again for a moment before it counts as the tool's own."""
        attrs = self._exited_inspect(container_id)
        for pause in OOM_EVENT_WAITS:
            state = attrs["State"]
            killed = int(state.get("ExitCode", -1)) == SIGKILL_EXIT and stopped_for is None
            if not killed or state.get("OOMKilled"):
                return attrs
            time.sleep(pause)
            attrs = self._exited_inspect(container_id)
        if not attrs["State"].get("OOMKilled") and self._oom_event_seen(container_id, attrs):
            # The engine clears the flag when the kernel's OOM note reaches it after the exit;
            # the "oom" event it logged for the container still says what happened.
            attrs["State"]["OOMKilled"] = True
        return attrs

    def _oom_event_seen(self, container_id: str, attrs: dict[str, Any]) -> bool:
        """Whether the engine's event log holds an "oom" event for this container."""
        created = _parse_docker_time(attrs.get("Created"))
        since = int(created.timestamp()) if created is not None else int(time.time()) - 3600
        try:
            events = self._api.events(
                since=since,
                until=round(time.time(), 3),
                filters={"container": [container_id], "event": ["oom"]},
                decode=True,
            )
            return any(event.get("Action") == "oom" for event in events)
        except _TRANSPORT_ERRORS:
            return False  # no proof either way: the exit stays the tool's own

    def _exited_inspect(self, container_id: str) -> dict[str, Any]:
        attrs = self._inspect(container_id)
        if attrs is None or attrs["State"]["Status"] in _GOING:
            # Released, the next owner sees it missing and requeues it as container_lost.
            raise RunnerUnavailable(f"container {container_id} disappeared before its outputs")
        return attrs

    def _collect(
        self,
        container_id: str,
        spec: AttemptSpec,
        control: AttemptControl,
        stopped_for: StopReason | None,
        live: _LiveLogs,
        watch: AttemptWatch,
        sampled: Counters,
    ) -> AttemptResult:
        attrs = self._exited_attrs(container_id, stopped_for)
        if wants_egress(spec.tool):
            self._egress.report(spec.container_name, control.note)
        state = attrs["State"]
        exit_code = int(state.get("ExitCode", -1))
        finished_text = state.get("FinishedAt")
        finished_at = _parse_docker_time(finished_text)
        image_digest = str(attrs.get("Image") or "") or None
        cap = int(spec.tool.get("stdout_cap_bytes") or self._limits.stdout_cap_bytes)
        try:
            stdout, stderr = stored_logs(self._api, container_id, cap, live.redactor)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read logs of {container_id}: {exc}") from exc
        if not live.started and finished_at is not None and (stdout.total or stderr.total):
            live.replay(stdout, stderr, self._replay_stamp(container_id, str(finished_text)))
        common: dict[str, Any] = {
            "exit_code": exit_code,
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "stdout_truncated": stdout.truncated,
            "stderr_truncated": stderr.truncated,
            "image_digest": image_digest,
        }
        disk_used = watch.disk_used()
        common["usage"] = usage_of(
            self._meter.read(spec.container_name, sampled),
            started_at=_parse_docker_time(state.get("StartedAt")),
            finished_at=finished_at,
            disk_bytes=disk_used,
        )
        facts = ExitFacts(
            exit_code=exit_code,
            oom_killed=bool(state.get("OOMKilled")),
            finished_at=finished_at,
            deadline_at=spec.deadline_at,
            stopped_for=stopped_for,
            cancel_requested=control.cancel.is_set(),
            # Only a failed exit can be explained by a fill (an adopter has no other proof).
            disk_used_bytes=disk_used if exit_code != 0 else None,
        )
        verdict = decide_exit(facts, watch.limits)
        if verdict.read_result:
            result_cap = int(spec.tool.get("result_cap_bytes") or self._limits.result_cap_bytes)
            depth = int(spec.tool.get("result_max_depth") or DEFAULT_MAX_DEPTH)
            result, problem = self._read_result(container_id, spec, attrs, result_cap, depth)
            verdict = decide_result(problem)
            common["result"] = live.redactor.json(result) if problem is None else None
        error = None if verdict.error is None else live.redactor.text(verdict.error)
        outcome = AttemptResult(
            status=verdict.status, error_code=verdict.error_code, error=error, **common
        )
        if control.artifacts is None:
            return outcome
        _fence(control, spec)
        return self._collect_artifacts(
            container_id, spec, attrs, control.artifacts, outcome, live.redactor
        )

    def _collect_artifacts(
        self,
        container_id: str,
        spec: AttemptSpec,
        attrs: dict[str, Any],
        store: ArtifactStore,
        outcome: AttemptResult,
        redactor: Redactor,
    ) -> AttemptResult:
        """Keep the files under ``out/`` as a new set, from the host work directory or the
        engine's tar stream, the tool's secret values masked; a refusal fails a success
        (``runyard.artifacts.rules``, ``runyard.artifacts.masking``)."""
        limits = ArtifactLimits.of(spec.tool)
        labels = attrs.get("Config", {}).get("Labels") or {}
        writer = store.writer(spec.run_id)
        try:
            host_dir = self._host_dir(spec.container_name, labels)
            if host_dir is not None:
                kept = collect_dir(host_dir / "out", writer, limits, redactor)
            else:
                kept = self._collect_archive(container_id, writer, limits, redactor)
            writer.done()
        except ArtifactRefused as caught:
            store.discard(spec.run_id, writer.set_id)
            # Its paths are masked already; the message is masked once more, whatever it holds.
            refused = ArtifactRefused(caught.code, redactor.text(caught.message))
            logger.info(
                "artifacts refused",
                extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "error": str(refused)},
            )
            return with_artifacts(outcome, refused, None)
        except (CollectError, *_TRANSPORT_ERRORS) as exc:
            store.discard(spec.run_id, writer.set_id)
            raise RunnerUnavailable(f"cannot read the artifacts of {container_id}: {exc}") from exc
        except BaseException:
            store.discard(spec.run_id, writer.set_id)
            raise
        logger.info(
            "artifacts collected",
            extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "files": kept},
        )
        return with_artifacts(outcome, None, writer.set_id)

    def _collect_archive(
        self,
        container_id: str,
        writer: ArtifactWriter,
        limits: ArtifactLimits,
        redactor: Redactor,
    ) -> int:
        """``out/`` as the engine's tar stream, member by member."""
        try:
            stream, stat = self._api.get_archive(
                container_id, f"{WORKDIR}/out", chunk_size=CHUNK_SIZE
            )
        except docker.errors.NotFound:
            return 0
        if stat_is_link(stat):
            raise ArtifactRefused(ErrorCode.INVALID_ARTIFACT, "/runyard/out is a link")
        return collect_tar(stream, writer, limits, redactor=redactor)

    def _read_result(
        self, container_id: str, spec: AttemptSpec, attrs: dict[str, Any], cap: int, depth: int
    ) -> tuple[Any | None, str | None]:
        """Read ``out/result.json`` from the host work directory, or else as a tar stream
        from the engine (checked by ``parse_result_archive``)."""
        labels = attrs.get("Config", {}).get("Labels") or {}
        if self._workdirs is not None and self._host_dir(spec.container_name, labels):
            return self._workdirs.read_result(spec.container_name, cap, depth)
        try:
            stream, stat = self._api.get_archive(container_id, f"{WORKDIR}/out/result.json")
            return parse_result_archive(stat, stream, cap, depth)
        except docker.errors.NotFound:
            return None, None
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read the result of {container_id}: {exc}") from exc

    # --- cleanup ---

    def _remove(self, ref: str) -> None:
        _unless_gone(lambda: self._api.remove_container(ref, force=True), f"remove {ref}")

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove the attempt's container and volume (after the terminal commit)."""
        name = container_name(run_id, attempt)
        self._remove(name)
        self._remove_volume(name)
        self._egress.discard(name)
        self._meter.forget(name)
        if self._workdirs is not None:
            self._workdirs.remove(name)

    def _remove_volume(self, name: str) -> None:
        """Remove the attempt's volume; one the engine says is still mounted with no container
        left is given up on (logged once), and the sweep stops listing it."""
        try:
            self._api.remove_volume(name, force=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if STUCK_MOUNT not in str(exc.explanation or exc):
                raise RunnerUnavailable(f"cannot remove volume {name}: {exc}") from exc
            # Docker 20.10 with live-restore never forgets the mount of a bind-backed volume
            # whose container ran across a dockerd restart: the record stays until the
            # engine's next restart; the directory behind it is removed all the same.
            if name not in self._stuck_volumes:
                self._stuck_volumes.add(name)
                logger.warning(
                    "the engine keeps a volume it says is still mounted; left to its next restart",
                    extra={"volume": name, "error": str(exc.explanation or exc)},
                )
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot remove volume {name}: {exc}") from exc

    def managed_attempts(self) -> list[ManagedAttempt]:
        """Labelled containers, and labelled volumes left without their container."""
        selector = {"label": f"{LABEL_MANAGED}=true"}
        found: dict[tuple[uuid.UUID, int], ManagedAttempt] = {}
        try:
            # The list's own summaries carry labels and state: no inspect per container.
            containers = self._api.containers(all=True, filters=selector)
            volumes = self._api.volumes(filters=selector).get("Volumes") or []
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot list managed containers: {exc}") from exc
        for summary in containers:
            attempt = _attempt_of(summary.get("Labels") or {})
            if attempt is not None:
                running = summary.get("State") in _RUNNING
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], running)
        for volume in volumes:
            attempt = _attempt_of(volume.get("Labels") or {})
            if volume.get("Name") in self._stuck_volumes:
                continue
            if attempt is not None and attempt not in found:
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], False)
        for attempt in self._workdirs.attempts() if self._workdirs is not None else []:
            if attempt not in found:
                found[attempt] = ManagedAttempt(attempt[0], attempt[1], False)
        # Egress proxies of these attempts go with their discard; those of none, now.
        self._egress.note_leftovers({container_name(*attempt) for attempt in found})
        return list(found.values())


class _LiveLogs:
    """The live log followers of one attempt, started on demand (or never, for quick runs)."""

    def __init__(
        self, source: ContainerLogs, sink: LogSink | None, cap: int, redactor: Redactor
    ) -> None:
        self._source = source
        self._sink = sink
        self._cap = cap
        # The tool's secret values: masked in every chunk and in the stored outputs.
        self.redactor = redactor
        self._followers: list[LogFollower] = []
        self.started = sink is None  # nothing to stream: never start

    def start(self) -> None:
        """Follow both streams from where the sink says the last owner stopped."""
        if self.started or self._sink is None:
            return
        self.started = True
        self._followers = [
            LogFollower(self._source, stream, self._sink, self._cap, self.redactor)
            for stream in ("stdout", "stderr")
        ]
        for follower in self._followers:
            follower.start()

    def stop(self) -> None:
        """Stop following now."""
        for follower in self._followers:
            follower.stop()

    def join(self) -> None:
        """Let the followers drain the ended streams."""
        for follower in self._followers:
            follower.join(timeout=5.0)

    def replay(self, stdout: HeadTailBuffer, stderr: HeadTailBuffer, finished_at: str) -> None:
        """The whole (capped) log of an attempt that ended before anyone followed it.

        Only the runner that started the container calls it, so no chunk of this attempt
        exists yet. One chunk per stream, stamped no earlier than the last line's timestamp:
        an adopter after us resumes past all of them (no repeat), and one before this point
        finds no chunk and follows from the start (no loss).
        """
        if self._sink is None:
            return
        for stream, buffer in (("stdout", stdout), ("stderr", stderr)):
            if not buffer.total:
                continue
            try:
                self._sink.write(stream, buffer.text(), finished_at)
            except Exception:
                # As for a follower: live chunks are a courtesy, the stored log is the record.
                logger.warning("could not send the log of a quick attempt", exc_info=True)


def _unsupported(error: str) -> AttemptResult:
    return AttemptResult(
        status=RunStatus.FAILED, error_code=ErrorCode.ENGINE_UNSUPPORTED, error=error
    )


def _refused(spec: AttemptSpec, error: str) -> AttemptResult:
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


def _engine_message(exc: docker.errors.APIError) -> str:
    """The engine's own words, without the request's URL."""
    explanation = exc.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", errors="replace")
    return str(explanation or exc)


def _deps_room(spec: AttemptSpec, store: ArtifactStore | None) -> DepsRoom:
    """What the dependencies' artifacts copied into the attempt's /runyard take (not the
    tool's to pay for out of its ``disk_mb``), from the sizes the store recorded."""
    if not spec.dep_artifacts or store is None:
        return DepsRoom()
    try:
        return deps_room(deps_files(store, spec.dep_artifacts))
    except DBAPIError:
        raise  # the database's trouble: the worker classifies it
    except Exception as exc:  # the store's disk
        raise RunnerUnavailable(f"cannot read the dependencies' artifacts: {exc}") from exc


def _unless_gone(call: Callable[[], object], what: str) -> None:
    """Make an engine call for which an object already gone is as good as done."""
    try:
        call()
    except docker.errors.NotFound:
        pass
    except _TRANSPORT_ERRORS as exc:
        raise RunnerUnavailable(f"cannot {what}: {exc}") from exc


def _link_creator(attrs: dict[str, Any]) -> None:
    """Link the adopter's span to the span of the owner that created the container (its
    TRACEPARENT), so the trace shows whose attempt this one carries on."""
    traced = tracing()
    if not traced.enabled:
        return
    pairs = (entry.partition("=") for entry in attrs.get("Config", {}).get("Env") or [])
    env = {name: value for name, _, value in pairs if name in ("TRACEPARENT", "TRACESTATE")}
    creator = parse_context(env.get("TRACEPARENT"), env.get("TRACESTATE"))
    if creator is not None:
        traced.link(creator)


def _fence(control: AttemptControl, spec: AttemptSpec) -> None:
    """Touch the engine only while this process still owns the attempt."""
    if control.abandon.is_set() or not control.still_owner():
        raise AttemptAbandoned(spec.container_name)


def _attempt_of(labels: dict[str, str]) -> tuple[uuid.UUID, int] | None:
    try:
        return uuid.UUID(labels[LABEL_RUN_ID]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
