"""What an attempt's container consumes, read from its cgroup (or the engine's stats).

A container's own cgroup goes with it when it exits, and its last figures with it. So when
the engine places cgroups by path (the ``cgroupfs`` driver) and this process sees the
engine's cgroup tree, every attempt's container is created under a parent cgroup of its own,
``/runyard/<container name>``: the kernel keeps the counters of a child that is gone in its
parent, so CPU time and the memory peak are exact at the exit, for whichever owner reads them
(an adopter too), until the parent is removed with the attempt's container. Otherwise the
engine's stats are sampled while the container runs, and the last sample stands.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions

from runyard.domain.isolation import is_rootless
from runyard.domain.usage import Counters, add_sample

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
SAMPLE_SECONDS = 1.0
_ERRORS = (OSError, ValueError, docker.errors.DockerException, requests.exceptions.RequestException)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path: Path, key: str) -> int | None:
    """``key value`` lines (``cpu.stat``): the value of ``key``."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def net_bytes(pid: int, proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """Received and sent bytes of every interface but loopback in ``pid``'s network."""
    try:
        lines = (proc / str(pid) / "net" / "dev").read_text().splitlines()[2:]
    except OSError:
        return None
    rx = tx = 0
    for line in lines:
        name, _, figures = line.partition(":")
        fields = figures.split()
        if name.strip() == "lo" or len(fields) < 9:
            continue
        rx += int(fields[0])
        tx += int(fields[8])
    return rx, tx


class CgroupFigures:
    """The figures of one attempt's parent cgroup, version 1 or 2."""

    def __init__(self, root: Path, relative: str) -> None:
        self._root = root
        self._relative = relative.strip("/")
        self._v2 = (root / "cgroup.controllers").exists()

    def _dir(self, controller: str) -> Path:
        if self._v2:
            return self._root / self._relative
        return self._root / controller / self._relative

    def exists(self) -> bool:
        """Whether the engine made the cgroup where this process looks."""
        return self._dir("cpuacct").is_dir()

    def cpu_ns(self) -> int | None:
        """CPU time of everything that ran in it, in nanoseconds."""
        if self._v2:
            usec = _read_keyed(self._dir("cpu") / "cpu.stat", "usage_usec")
            return None if usec is None else usec * 1000
        return _read_int(self._dir("cpuacct") / "cpuacct.usage")

    def memory_now(self) -> int | None:
        """Memory charged to it now."""
        if self._v2:
            return _read_int(self._dir("memory") / "memory.current")
        return _read_int(self._dir("memory") / "memory.usage_in_bytes")

    def memory_peak(self) -> int | None:
        """The most memory ever charged to it (None where the kernel keeps no peak)."""
        if self._v2:
            return _read_int(self._dir("memory") / "memory.peak")
        return _read_int(self._dir("memory") / "memory.max_usage_in_bytes")

    def remove(self, *, quiet: bool = False) -> bool:
        """Remove the (empty) cgroup from every hierarchy it was made in; False if one is
        still there (busy: a process in it is still dying), logged unless ``quiet``."""
        removed = True
        for path in self._made_in():
            try:
                os.rmdir(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                removed = False
                if not quiet:
                    logger.warning("cgroup not removed", extra={"path": path, "error": str(exc)})
        return removed

    def _made_in(self) -> list[str]:
        """Where the cgroup may be: under the root (version 2), or under each hierarchy of
        version 1, once each (``cpu`` and ``cpuacct`` are links to ``cpu,cpuacct``)."""
        if self._v2:
            return [os.path.join(self._root, self._relative)]
        try:
            with os.scandir(self._root) as entries:
                found = [e.path for e in entries if e.is_dir() and not e.is_symlink()]
        except FileNotFoundError:
            return []
        return [os.path.join(path, self._relative) for path in found]


class Sampling:
    """One running container's memory (and network) samples, taken by ``poll`` from the
    loop that waits on it: one every ``interval`` seconds, no thread of its own."""

    def __init__(
        self,
        read: Callable[[], tuple[Counters, int | None]],
        interval: float = SAMPLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._interval = interval
        self._clock = clock
        self._next = clock() + interval
        self._lock = threading.Lock()
        self._counters = Counters()

    def poll(self) -> None:
        """Take a sample if one is due."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        self.sample_once()

    def sample_once(self) -> None:
        """Take one sample (errors leave the previous one standing)."""
        try:
            counters, memory = self._read()
        except _ERRORS as exc:
            logger.debug("usage sample failed", extra={"error": str(exc)})
            return
        with self._lock:
            before = self._counters
            self._counters = add_sample(
                Counters(
                    cpu_ns=counters.cpu_ns or before.cpu_ns,
                    memory_peak_bytes=max(
                        counters.memory_peak_bytes or 0, before.memory_peak_bytes or 0
                    ),
                    memory_sum=before.memory_sum,
                    memory_samples=before.memory_samples,
                    net_rx_bytes=counters.net_rx_bytes,
                    net_tx_bytes=counters.net_tx_bytes,
                ),
                memory,
            )

    def stop(self) -> Counters:
        """The latest counters, the memory samples summed."""
        with self._lock:
            return self._counters


def stats_counters(stats: dict[str, Any]) -> tuple[Counters, int | None]:
    """The counters of one answer of the engine's ``stats``, and its memory in use."""
    cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    memory = stats.get("memory_stats") or {}
    networks = stats.get("networks")
    usage = memory.get("usage")
    rx = tx = None
    if networks:
        rx = sum(int(n.get("rx_bytes", 0)) for n in networks.values())
        tx = sum(int(n.get("tx_bytes", 0)) for n in networks.values())
    counters = Counters(
        cpu_ns=cpu.get("total_usage") or None,
        memory_peak_bytes=memory.get("max_usage") or None,
        net_rx_bytes=rx,
        net_tx_bytes=tx,
    )
    return counters, int(usage) if usage else None


class UsageMeter:
    """Meters the attempts of one engine: where their containers' cgroups go, and reads."""

    def __init__(
        self,
        api: Any,
        *,
        cgroup_root: Path = CGROUP_ROOT,
        interval: float = SAMPLE_SECONDS,
    ) -> None:
        self._api = api
        self._root = cgroup_root
        self._interval = interval
        self._by_path: bool | None = None

    def _places_by_path(self) -> bool:
        """Whether the engine takes a cgroup parent as a path this process can read: a
        cgroupfs engine, not a rootless one (it may not make cgroups at the hierarchy's top)."""
        if self._by_path is None:
            try:
                info = self._api.info()
            except _ERRORS:
                return False
            driver = str(info.get("CgroupDriver") or "")
            self._by_path = driver == "cgroupfs" and not is_rootless(info) and self._root.is_dir()
        return self._by_path

    def cgroup_parent(self, name: str) -> str | None:
        """The parent cgroup to create the attempt's container under, if any."""
        return f"/runyard/{name}" if self._places_by_path() else None

    def _cgroup(self, name: str) -> CgroupFigures | None:
        if not self._places_by_path():
            return None
        figures = CgroupFigures(self._root, f"/runyard/{name}")
        return figures if figures.exists() else None

    def follow(self, container_id: str, name: str, pid: int | None, networked: bool) -> Sampling:
        """Sample the running container (its cgroup if seen here, else the engine) as the
        loop waiting on it polls."""
        cgroup = self._cgroup(name)

        def from_cgroup() -> tuple[Counters, int | None]:
            assert cgroup is not None
            net = net_bytes(pid) if networked and pid else None
            counters = Counters(
                cpu_ns=cgroup.cpu_ns(),
                memory_peak_bytes=cgroup.memory_peak(),
                net_rx_bytes=None if net is None else net[0],
                net_tx_bytes=None if net is None else net[1],
            )
            return counters, cgroup.memory_now()

        def from_engine() -> tuple[Counters, int | None]:
            try:
                # One reading, at once (without one_shot the engine waits a second for two).
                answer = self._api.stats(container_id, stream=False, one_shot=True)
            except docker.errors.InvalidVersion:
                answer = self._api.stats(container_id, stream=False)
            return stats_counters(answer)

        return Sampling(from_cgroup if cgroup is not None else from_engine, self._interval)

    def read(self, name: str, sampled: Counters) -> Counters:
        """The exited attempt's counters: its parent cgroup's where it is kept, the samples'
        otherwise (the network's always come from the samples)."""
        cgroup = self._cgroup(name)
        if cgroup is None:
            return sampled
        return replace(
            sampled,
            cpu_ns=cgroup.cpu_ns() or sampled.cpu_ns,
            memory_peak_bytes=max(cgroup.memory_peak() or 0, sampled.memory_peak_bytes or 0),
        )

    def forget(self, name: str, *, quiet: bool = False) -> bool:
        """Remove the attempt's parent cgroup, if this process sees one (with its container;
        the engine is not asked); False if it is still busy."""
        return CgroupFigures(self._root, f"/runyard/{name}").remove(quiet=quiet)
