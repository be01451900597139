"""An attempt's container as the engine is asked to create it: the contract's labels, its
environment, and the hardening flags and limits that ``hardening.create_problems`` checks."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from docker.types import DriverConfig, LogConfig, Mount, Ulimit

from runyard.domain.attempt import AttemptSpec
from runyard.registry.tools import NO_NETWORK
from runyard.runners.docker.egress import EGRESS_DNS, egress_name, proxy_env, wants_egress
from runyard.runners.docker.hardening import WORKDIR, ContainerLimits
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.labels import (
    LABEL_ATTEMPT,
    LABEL_DEADLINE,
    LABEL_MANAGED,
    LABEL_RUN_ID,
    LABEL_TOOL,
    LABEL_WORKDIR,
)


def create_args(
    api: Any, spec: AttemptSpec, secrets: dict[str, str], input_dirs: HostWorkdirs | None
) -> dict[str, Any]:
    """The container's configuration: the contract's labels, env and hardening flags; its
    /runyard is a host work directory under ``input_dirs``, or a plain volume for None."""
    tool = spec.tool
    name = spec.container_name
    labels = {
        LABEL_MANAGED: "true",
        LABEL_RUN_ID: str(spec.run_id),
        LABEL_ATTEMPT: str(spec.attempt),
        LABEL_TOOL: str(tool["name"]),
        LABEL_DEADLINE: spec.deadline_at.astimezone(UTC).isoformat(),
    }
    if input_dirs is not None:
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
    host_config = api.create_host_config(
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
        mounts=[workdir_mount(name, labels, input_dirs)],
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


def workdir_mount(name: str, labels: dict[str, str], input_dirs: HostWorkdirs | None) -> Mount:
    """``/runyard``: the attempt's named volume, backed by its host directory if any."""
    driver = None
    if input_dirs is not None:
        driver = DriverConfig("local", input_dirs.volume_options(name))
    return Mount(target=WORKDIR, source=name, type="volume", labels=labels, driver_config=driver)
