"""The Docker adapter of the runner port: hardened, labelled, adoptable containers.

``DockerRunner`` coordinates the parts beside it: ``launch.py`` creates and starts a
container, ``waiting.py`` waits on it under its deadline, ``collector.py`` collects the exited
attempt, and ``leftovers.py`` removes and lists what the engine keeps of attempts.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from runyard.domain.attempt import AttemptResult, AttemptSpec, ManagedAttempt, container_name
from runyard.domain.states import ContainerState
from runyard.platform.faults import AFTER_CREATE, crash_point
from runyard.platform.settings import Settings
from runyard.platform.tracing import parse_context, tracing
from runyard.registry.secrets import SecretSource
from runyard.registry.tools import ToolSpec
from runyard.runner import AttemptControl, RunnerUnavailable
from runyard.runners.docker.collector import AttemptCollector
from runyard.runners.docker.connection import skip_environment_lookups
from runyard.runners.docker.egress import EgressGate
from runyard.runners.docker.engine_calls import (
    GOING,
    RUNNING,
    TRANSPORT_ERRORS,
    fence,
    inspect_container,
)
from runyard.runners.docker.engine_check import engine_problems
from runyard.runners.docker.engine_marker import EngineMarker
from runyard.runners.docker.host_workdirs import AttemptDirs, HostWorkdirs
from runyard.runners.docker.inputs import InputsChoice
from runyard.runners.docker.inputs import choose as choose_input_mode
from runyard.runners.docker.launch import (
    ContainerLauncher,
    ContainerRefused,
    EngineRefused,
    container_redactor,
    refused,
    unsupported,
)
from runyard.runners.docker.leftovers import AttemptLeftovers
from runyard.runners.docker.live_logs import AttemptLogs
from runyard.runners.docker.outputs import ContainerLogs
from runyard.runners.docker.socket_api import SocketApi, socket_api
from runyard.runners.docker.usage_meter import UsageMeter
from runyard.runners.docker.waiting import AttemptWaiter

logger = logging.getLogger(__name__)

# An engine that answered a request sent this recently needs no ping before a claim.
FRESH_ANSWER_SECONDS = 0.5


@dataclass(frozen=True)
class DockerLimits:
    """Operator-wide settings the adapter applies to every container."""

    stdout_cap_bytes: int = 1_048_576
    result_cap_bytes: int = 1_048_576
    stop_grace_seconds: float = 5.0
    api_timeout_seconds: float = 30.0


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
        # Every attempt's calls go straight over the engine's unix socket (socket_api.py).
        api = socket_api(client.api)
        self._api: Any = api
        # The networks and proxies of tools with an egress allow-list (egress.py).
        egress = egress or EgressGate(client.api)
        # What each attempt's container consumes (docs/operations.md, "Usage").
        meter = meter or UsageMeter(client.api)
        self._limits = limits or DockerLimits()
        self._marker = marker or EngineMarker(client)
        # With ``workdirs`` the input is written on the host, not uploaded (host_workdirs.py).
        self._dirs = AttemptDirs(workdirs)
        self._leftovers = AttemptLeftovers(api, self._dirs, egress, meter)
        # Values of the tools' secrets come from this process (docs/tools.md, "Secrets").
        self._launcher = ContainerLauncher(
            client, api, self._dirs, secrets or SecretSource(), egress, meter, self._leftovers
        )
        self._waiter = AttemptWaiter(api, self._dirs, meter, self._limits.stop_grace_seconds)
        self._collector = AttemptCollector(
            api,
            self._dirs,
            egress,
            meter,
            stdout_cap_bytes=self._limits.stdout_cap_bytes,
            result_cap_bytes=self._limits.result_cap_bytes,
        )

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
        self._dirs.choose(workdirs)
        return choice

    @property
    def input_mode(self) -> str:
        """``host`` or ``upload``: how new attempts get their input now."""
        return "host" if self._dirs.inputs is not None else "upload"

    # --- identity ---

    def engine_id(self) -> str:
        """The id kept in the engine's marker (``engine_marker``), made on first use."""
        return self._marker.engine_id()

    def engine_problems(self, tools: list[ToolSpec]) -> list[str]:
        """The tools whose runtime or network this engine lacks, one line each."""
        try:
            return engine_problems(self._api, tools)
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot ask the engine about runtimes: {exc}") from exc

    def ping(self) -> None:
        """Ask the engine for ``/_ping``, the cheapest call that proves it answers, unless
        it answered a new request of this runner's just now: that proves it as well."""
        if isinstance(self._api, SocketApi) and self._api.answered_within(FRESH_ANSWER_SECONDS):
            return
        try:
            self._api.ping()
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"the Docker engine does not answer: {exc}") from exc

    # --- lookup ---

    def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
        """Map the container's Docker state onto the runner's four states."""
        attrs = inspect_container(self._api, container_name(run_id, attempt))
        if attrs is None:
            return ContainerState.MISSING
        status = attrs["State"]["Status"]
        if status in GOING:
            return ContainerState.MISSING
        if status == "created":
            return ContainerState.CREATED
        if status in RUNNING:
            return ContainerState.RUNNING
        return ContainerState.EXITED

    # --- run ---

    def run(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        """Start or adopt the attempt's container, wait under its deadline, collect outputs.

        The create comes first: a fresh attempt (the common case) has no container yet, and
        an existing one answers 409, which sends us to inspect and adopt it, never to a twin.
        """
        for _ in range(3):
            fence(control, spec)
            with tracing().span("container.create"):
                created = self._launcher.create(spec, control.artifacts)
            if isinstance(created, AttemptResult):
                return created
            if created is not None:
                crash_point(AFTER_CREATE)
                # Left unstarted, the next owner removes it after a grace and creates anew.
                fence(control, spec)
                try:
                    with tracing().span("container.start"):
                        started = self._launcher.start(created, spec)
                    if not started:
                        continue
                except EngineRefused as exc:
                    return unsupported(str(exc))
                except ContainerRefused as exc:
                    return refused(spec, str(exc))
                return self._wait_and_collect(created, spec, control, started_here=True)
            attrs = self._launcher.settled(inspect_container(self._api, spec.container_name))
            if attrs is not None:
                logger.info(
                    "adopting existing container",
                    extra={"run_id": str(spec.run_id), "attempt": spec.attempt},
                )
                _link_creator(attrs)
                return self._wait_and_collect(str(attrs["Id"]), spec, control, started_here=False)
        raise RunnerUnavailable(f"could not settle on one container for {spec.container_name}")

    def _wait_and_collect(
        self, container_id: str, spec: AttemptSpec, control: AttemptControl, *, started_here: bool
    ) -> AttemptResult:
        cap = int(spec.tool.get("stdout_cap_bytes") or self._limits.stdout_cap_bytes)
        redactor = container_redactor(self._api, container_id, spec)
        live = AttemptLogs(ContainerLogs(self._api, container_id), control.logs, cap, redactor)
        if not started_here:
            live.start()  # the previous owner was streaming: carry on at once
        watch = self._waiter.watch(container_id, spec, control)
        sampling = self._waiter.sample(container_id, spec)
        try:
            with tracing().span("container.wait", attributes={"runyard.adopted": not started_here}):
                stopped_for = self._waiter.wait(container_id, spec, control, live, watch, sampling)
        except BaseException:
            live.stop()
            raise
        live.join()
        sampled = sampling.stop()
        with tracing().span("outputs.collect"):
            return self._collector.collect(
                container_id, spec, control, stopped_for, live, watch, sampled
            )

    # --- cleanup ---

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove the attempt's container and volume (after the terminal commit)."""
        self._leftovers.discard(run_id, attempt)

    def managed_attempts(self) -> list[ManagedAttempt]:
        """Labelled containers, and labelled volumes left without their container."""
        return self._leftovers.managed_attempts()


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
