"""The usage meter's reads: cgroup files of both versions, a network's bytes, engine stats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runyard.domain.usage import Counters
from runyard.runners.docker.usage_meter import (
    CgroupFigures,
    Sampling,
    UsageMeter,
    net_bytes,
    stats_counters,
)

NAME = "runyard-0000-1"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    write(tmp_path / "cpuacct" / "runyard" / NAME / "cpuacct.usage", "2500000000\n")
    write(tmp_path / "memory" / "runyard" / NAME / "memory.max_usage_in_bytes", "4096\n")
    write(tmp_path / "memory" / "runyard" / NAME / "memory.usage_in_bytes", "1024\n")
    return tmp_path


@pytest.fixture
def v2(tmp_path: Path) -> Path:
    write(tmp_path / "cgroup.controllers", "cpu memory\n")
    write(tmp_path / "runyard" / NAME / "cpu.stat", "usage_usec 1500000\nuser_usec 1\n")
    write(tmp_path / "runyard" / NAME / "memory.peak", "8192\n")
    write(tmp_path / "runyard" / NAME / "memory.current", "2048\n")
    return tmp_path


def test_cgroup_figures__version_one(v1: Path):
    figures = CgroupFigures(v1, f"/runyard/{NAME}")
    assert figures.exists()
    assert (figures.cpu_ns(), figures.memory_peak(), figures.memory_now()) == (
        2_500_000_000,
        4096,
        1024,
    )


def test_cgroup_figures__version_two(v2: Path):
    figures = CgroupFigures(v2, f"/runyard/{NAME}")
    assert (figures.cpu_ns(), figures.memory_peak(), figures.memory_now()) == (
        1_500_000_000,
        8192,
        2048,
    )


def test_cgroup_figures__missing_files_read_as_unknown(tmp_path: Path):
    figures = CgroupFigures(tmp_path, f"/runyard/{NAME}")
    assert not figures.exists()
    assert (figures.cpu_ns(), figures.memory_peak(), figures.memory_now()) == (None, None, None)


def test_cgroup_figures__remove_takes_the_empty_directories_of_every_hierarchy(tmp_path: Path):
    for controller in ("cpuacct", "memory", "pids"):
        (tmp_path / controller / "runyard" / NAME).mkdir(parents=True)
    CgroupFigures(tmp_path, f"/runyard/{NAME}").remove()
    assert not list(tmp_path.glob(f"*/runyard/{NAME}"))
    CgroupFigures(tmp_path, f"/runyard/{NAME}").remove()  # gone already: nothing to do


def test_net_bytes__every_interface_but_loopback(tmp_path: Path):
    write(
        tmp_path / "7" / "net" / "dev",
        "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n"
        "    lo: 900 9 0 0 0 0 0 0 900 9 0 0 0 0 0 0\n"
        "  eth0: 100 1 0 0 0 0 0 0 40 1 0 0 0 0 0 0\n"
        "  eth1: 5 1 0 0 0 0 0 0 2 1 0 0 0 0 0 0\n",
    )
    assert net_bytes(7, proc=tmp_path) == (105, 42)
    assert net_bytes(8, proc=tmp_path) is None


def test_stats_counters__engine_answers_with_and_without_figures():
    counters, memory = stats_counters(
        {
            "cpu_stats": {"cpu_usage": {"total_usage": 30}},
            "memory_stats": {"usage": 7, "max_usage": 9},
            "networks": {"eth0": {"rx_bytes": 3, "tx_bytes": 4}},
        }
    )
    assert counters == Counters(cpu_ns=30, memory_peak_bytes=9, net_rx_bytes=3, net_tx_bytes=4)
    assert memory == 7
    assert stats_counters({"memory_stats": {}}) == (Counters(), None)


def test_sampling__sums_memory_and_keeps_the_latest_counters():
    answers = iter([(Counters(cpu_ns=1), 100), (Counters(cpu_ns=5, net_rx_bytes=2), 300)])

    def read() -> tuple[Counters, int | None]:
        for answer in answers:
            return answer
        raise OSError("the cgroup is gone")

    sampling = Sampling(read, interval=3600)
    sampling.sample_once()
    sampling.sample_once()
    sampling.sample_once()  # a failed read leaves the last one standing
    counters = sampling.stop()
    assert (counters.cpu_ns, counters.net_rx_bytes) == (5, 2)
    assert (counters.memory_peak_bytes, counters.memory_sum, counters.memory_samples) == (
        300,
        400,
        2,
    )


class StubApi:
    def __init__(self, driver: str, **info: Any) -> None:
        self.driver = driver
        self.extra = info

    def info(self) -> dict[str, Any]:
        return {"CgroupDriver": self.driver, **self.extra}


def test_usage_meter__parent_cgroup_only_for_a_driver_that_takes_paths(v1: Path):
    assert UsageMeter(StubApi("cgroupfs"), cgroup_root=v1).cgroup_parent(NAME) == f"/runyard/{NAME}"
    assert UsageMeter(StubApi("systemd"), cgroup_root=v1).cgroup_parent(NAME) is None
    missing = v1 / "elsewhere"
    assert UsageMeter(StubApi("cgroupfs"), cgroup_root=missing).cgroup_parent(NAME) is None
    # A rootless engine (Podman's, Docker's) may not make cgroups at the top of the hierarchy.
    for rootless in ({"Rootless": True}, {"SecurityOptions": ["name=seccomp", "name=rootless"]}):
        api = StubApi("cgroupfs", **rootless)
        assert UsageMeter(api, cgroup_root=v1).cgroup_parent(NAME) is None


def test_usage_meter__an_exited_attempt_reads_its_parent_cgroup(v1: Path):
    meter = UsageMeter(StubApi("cgroupfs"), cgroup_root=v1)
    sampled = Counters(cpu_ns=1, memory_peak_bytes=9000, memory_sum=10, memory_samples=1)
    counters = meter.read(NAME, sampled)
    assert (counters.cpu_ns, counters.memory_peak_bytes, counters.memory_samples) == (
        2_500_000_000,
        9000,
        1,
    )
    assert UsageMeter(StubApi("systemd"), cgroup_root=v1).read(NAME, sampled) == sampled


class StatsApi(StubApi):
    def __init__(self) -> None:
        super().__init__("systemd")
        self.asked: list[dict[str, Any]] = []

    def stats(self, container: str, **kwargs: Any) -> dict[str, Any]:
        self.asked.append(kwargs)
        return {"cpu_stats": {"cpu_usage": {"total_usage": 9}}, "memory_stats": {"usage": 4}}


def test_usage_meter__without_a_cgroup_samples_the_engine_once_at_a_time(v1: Path):
    api = StatsApi()
    sampling = UsageMeter(api, cgroup_root=v1, interval=3600).follow("c0ffee", NAME, None, False)
    sampling.sample_once()
    counters = sampling.stop()
    assert api.asked == [{"stream": False, "one_shot": True}]
    assert (counters.cpu_ns, counters.memory_sum, counters.memory_samples) == (9, 4, 1)


def test_sampling__polled_takes_a_sample_once_per_interval():
    now = [100.0]
    reads: list[float] = []

    def read() -> tuple[Counters, int | None]:
        reads.append(now[0])
        return Counters(cpu_ns=int(now[0])), 10

    sampling = Sampling(read, interval=1.0, clock=lambda: now[0])
    for step in (0.0, 0.5, 0.5, 0.2, 0.9, 0.3):  # polled as the wait loop goes round
        now[0] += step
        sampling.poll()
    assert reads == pytest.approx([101.0, 102.1])
    assert sampling.stop().memory_samples == 2
