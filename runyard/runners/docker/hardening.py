"""What every container gets, as pure functions: its limits from the run's tool snapshot, and
the check that the create arguments really hold them and the hardening flags.

The check is defence in depth behind the bounds of the API and the registry
(``runyard.domain.limit_bounds``): a snapshot that slipped past them (stored before a bound
existed, or written by hand) fails its run with ``container_refused``; runyard never asks the
engine for a container without a CPU, memory or pids limit, nor for one that would share the
host's (or another container's) network, process, IPC, UTS, user or cgroup namespace, loosen
the engine's seccomp, AppArmor or SELinux confinement, or reach host paths or devices beyond
the attempt's own volume (none of that can be asked for in the registry). Docker reads a
missing or 0 ``NanoCpus`` and ``PidsLimit`` as "no limit", and rounds less than 0.01 CPU down
to none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runyard.domain.isolation import engine_memory_mb, engine_pids_limit
from runyard.domain.limit_bounds import MIN_CPUS, MIN_MEMORY_MB

# Where the attempt's volume is mounted: the one mount a container has.
WORKDIR = "/runyard"
DEFAULT_DISK_MB = 1024
DEFAULT_TMPFS_MB = 16
DEFAULT_NOFILE = 1024
MIN_NANO_CPUS = round(MIN_CPUS * 1e9)
MIN_MEMORY_BYTES = MIN_MEMORY_MB << 20


@dataclass(frozen=True)
class ContainerLimits:
    """The resource limits of one container, in the engine's units (under gVisor with the
    sandbox's own allowance, ``runyard.domain.isolation``)."""

    nano_cpus: int
    memory_bytes: int
    pids: int
    nofile: int
    tmpfs_mb: int
    # The ``fsize`` ulimit: no single file may pass the disk limit (nor the /tmp size, if
    # larger); the kernel enforces it exactly, between two polls of the disk watch.
    fsize_bytes: int

    @classmethod
    def of(cls, tool: Mapping[str, Any]) -> ContainerLimits:
        """The limits of a run's tool snapshot (a value that is no number gives no limit,
        which ``create_problems`` then refuses)."""
        cpus = float(tool["cpus"])
        runtime = tool.get("runtime")
        tmpfs_mb = int(tool.get("tmpfs_mb") or DEFAULT_TMPFS_MB)
        disk_mb = int(tool.get("disk_mb") or DEFAULT_DISK_MB)
        return cls(
            nano_cpus=round(cpus * 1e9) if math.isfinite(cpus) else 0,
            memory_bytes=engine_memory_mb(int(tool["memory_mb"]), runtime) << 20,
            pids=engine_pids_limit(int(tool["pids_limit"]), runtime),
            nofile=int(tool.get("nofile_limit") or DEFAULT_NOFILE),
            tmpfs_mb=tmpfs_mb,
            fsize_bytes=max(disk_mb, tmpfs_mb) << 20,
        )


# The only security option runyard sets. Any other (``seccomp=unconfined``,
# ``apparmor=unconfined``, ``label=disable``, ``systempaths=unconfined``, a profile of its
# own, ``no-new-privileges=false``) would loosen the engine's defaults.
_SECURITY_OPTS = frozenset({"no-new-privileges"})
# Network modes that are no network of the tool's own: the host's stack, the engine's alias
# for the bridge. ``container:<id>`` (another container's stack) has a colon, which no
# network name the registry accepts has.
_SHARED_NETWORKS = frozenset({"", "host", "default"})
# Namespaces a container gets of its own unless told to share the host's or another
# container's (``UsernsMode`` "host" turns the engine's user namespace remapping off).
_NAMESPACES = {
    "PidMode": "process",
    "IpcMode": "IPC",
    "UTSMode": "UTS",
    "UsernsMode": "user",
    "CgroupnsMode": "cgroup",
}
# What would give the container the host's files or devices.
_HOST_ACCESS = {
    "Binds": "host paths bound in",
    "VolumesFrom": "another container's volumes",
    "Devices": "host devices",
    "DeviceRequests": "host devices",
    "DeviceCgroupRules": "host devices",
}


def create_problems(host_config: Mapping[str, Any]) -> list[str]:
    """What would leave a container made with ``host_config`` (the engine's ``HostConfig``)
    without a limit or a hardening flag, or would give it the host's or another container's
    namespaces, files or devices, one phrase each; empty when it holds them all."""
    problems = []
    nano_cpus = int(host_config.get("NanoCpus") or 0)
    if nano_cpus < MIN_NANO_CPUS:
        problems.append(f"no CPU limit ({nano_cpus / 1e9:g} CPUs asked, {MIN_CPUS} at least)")
    memory = int(host_config.get("Memory") or 0)
    if memory < MIN_MEMORY_BYTES:
        problems.append(f"no memory limit ({memory} bytes asked, {MIN_MEMORY_MB} MB at least)")
    elif host_config.get("MemorySwap") != memory:
        problems.append("swap beyond the memory limit")
    if int(host_config.get("PidsLimit") or 0) < 1:
        problems.append("no pids limit")
    if host_config.get("Privileged"):
        problems.append("privileged mode")
    if host_config.get("CapAdd") or "ALL" not in (host_config.get("CapDrop") or []):
        problems.append("capabilities left")
    security = [str(option) for option in host_config.get("SecurityOpt") or []]
    if "no-new-privileges" not in security:
        problems.append("no no-new-privileges")
    problems.extend(
        f"the security option {option!r}" for option in security if option not in _SECURITY_OPTS
    )
    if not host_config.get("ReadonlyRootfs"):
        problems.append("a writable root filesystem")
    network = str(host_config.get("NetworkMode") or "")
    if network in _SHARED_NETWORKS:
        problems.append("the host's or the default network")
    elif ":" in network:
        problems.append(f"another container's network ({network!r})")
    for key, namespace in _NAMESPACES.items():
        mode = str(host_config.get(key) or "")
        if mode == "host" or mode.startswith("container:"):
            whose = "the host's" if mode == "host" else "another container's"
            problems.append(f"{whose} {namespace} namespace ({key} {mode!r})")
    for key, what in _HOST_ACCESS.items():
        if host_config.get(key):
            problems.append(f"{what} ({key})")
    problems.extend(_mount_problems(host_config.get("Mounts") or []))
    return problems


def _mount_problems(mounts: list[Mapping[str, Any]]) -> list[str]:
    """Any mount but the attempt's one volume at ``/runyard``."""
    targets = [str(mount.get("Target") or "") for mount in mounts]
    problems = [
        f"a mount beyond the work directory ({mount.get('Type')!s} at {target!r})"
        for mount, target in zip(mounts, targets, strict=True)
        if target != WORKDIR or mount.get("Type") != "volume"
    ]
    if targets.count(WORKDIR) > 1:
        problems.append(f"more than one mount at {WORKDIR}")
    return problems
