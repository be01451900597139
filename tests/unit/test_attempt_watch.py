"""The disk measure and the idle rule of a running attempt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runyard.artifact_store import ArtifactFile
from runyard.artifacts.deps_out import DepsRoom, deps_room
from runyard.domain.outcomes import StopReason, ToolLimits
from runyard.runners.docker.watch import (
    AttemptWatch,
    IdleAction,
    IdleClock,
    deps_use,
    measure,
)


def test_measure__counts_allocated_bytes_without_following_links(tmp_path: Path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a").write_bytes(b"x" * 100_000)
    with (tmp_path / "out" / "sparse").open("wb") as handle:
        handle.truncate(1 << 30)  # 1 GiB apparent, nothing allocated
    os.symlink("/", tmp_path / "out" / "root-link")
    use = measure(tmp_path)
    assert use is not None
    assert 100_000 <= use.bytes < 200_000
    assert use.entries == 4
    assert not use.too_many_entries


def test_measure__stops_counting_past_the_entry_cap(tmp_path: Path):
    for index in range(101):
        (tmp_path / str(index)).touch()
    use = measure(tmp_path, max_entries=100)
    assert use is not None and use.too_many_entries
    under = measure(tmp_path, max_entries=101)
    assert under is not None and not under.too_many_entries and under.entries == 101


def test_measure__a_missing_directory_is_none(tmp_path: Path):
    assert measure(tmp_path / "gone") is None


def test_idle_clock__warns_once_at_half_then_stops():
    clock = IdleClock(limit_seconds=10.0, last_output=100.0)
    assert clock.check(104.9) is IdleAction.NONE
    assert clock.check(105.0) is IdleAction.WARN
    assert clock.check(107.0) is IdleAction.NONE
    clock.output_seen(108.0)
    assert clock.check(112.9) is IdleAction.NONE
    assert clock.check(113.0) is IdleAction.WARN
    assert clock.check(118.0) is IdleAction.STOP
    clock.output_seen(90.0)  # an older sighting never moves the clock back
    assert clock.check(118.0) is IdleAction.STOP


def _watch(
    tmp_path: Path, markers: list[object], now: list[float], notes: list[str]
) -> AttemptWatch:
    return AttemptWatch(
        ToolLimits(timeout_seconds=60, memory_mb=64, disk_mb=1, idle_timeout_seconds=8),
        workdir=lambda: tmp_path,
        output_marker=lambda: markers[0],
        note=lambda kind, data: notes.append(kind),
        log_extra={},
        clock=lambda: now[0],
    )


def test_attempt_watch__output_resets_idle_and_a_fill_stops(tmp_path: Path):
    markers: list[object] = [("log", 1)]
    now: list[float] = [0.0]
    notes: list[str] = []
    watch = _watch(tmp_path, markers, now, notes)
    assert watch.check() is None
    now[0] = 4.0
    assert watch.check() is None and notes == ["stale"]
    markers[0] = ("log", 2)  # the tool printed
    now[0] = 11.0
    assert watch.check() is None
    now[0] = 15.0
    assert watch.check() is None and notes == ["stale", "stale"]
    now[0] = 19.0
    assert watch.check() is StopReason.IDLE
    (tmp_path / "fill").write_bytes(b"x" * (1 << 20))
    assert watch.check() is StopReason.DISK


def _write(path: Path, size: int) -> ArtifactFile:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))  # random: no file system can store it in less
    return ArtifactFile(path.name, size, "")


def test_deps_room__whole_blocks_per_file_and_per_directory():
    files = {
        "r1": [ArtifactFile("a.txt", 0, ""), ArtifactFile("sub/deeper/b.bin", 5000, "")],
        "r2": [ArtifactFile("c", 4096, "")],
    }
    room = deps_room(files)
    # Files: 0 (empty: no block) + (2+1) + (1+1) blocks; directories: deps, deps/r1,
    # deps/r1/sub, deps/r1/sub/deeper, deps/r2.
    assert room == DepsRoom(bytes=(5 + 5) * 4096, entries=3 + 5)
    assert deps_room({}) == DepsRoom(bytes=4096, entries=1)


@pytest.mark.slow  # weighs 100,000 file records: seconds of CPU
def test_deps_room__empty_files_take_no_room():
    files = {f"r{n}": [ArtifactFile(f"f{i}", 0, "") for i in range(1000)] for n in range(100)}
    # 100 dependencies of 1,000 empty files: their directories only, not 400 MB more.
    assert deps_room(files) == DepsRoom(bytes=101 * 4096, entries=100_000 + 101)


def test_attempt_watch__dependencies_get_the_room_they_take_not_what_their_sizes_allow_for(
    tmp_path: Path,
):
    made = [_write(tmp_path / "deps" / "r1" / f"f{i}", 1) for i in range(300)]
    bound = deps_room({"r1": made})  # two blocks a file: twice what they take
    watch = AttemptWatch(
        ToolLimits(timeout_seconds=60, memory_mb=64, disk_mb=1),
        workdir=lambda: tmp_path,
        output_marker=lambda: None,
        note=lambda kind, data: None,
        log_extra={},
        deps_room=lambda: bound,
    )
    _write(tmp_path / "out" / "mine", 900 << 10)
    assert watch.check() is None
    # 1.2 MB of its own is past its 1 MB, however much room the bound would have left.
    _write(tmp_path / "out" / "more", 300 << 10)
    assert watch.check() is StopReason.DISK


def test_deps_use__measured_never_past_the_bound_and_nothing_without_deps(tmp_path: Path):
    made = [_write(tmp_path / "deps" / "r1" / f"f{i}", 5000) for i in range(10)]
    bound = deps_room({"r1": made})
    use = deps_use(tmp_path, bound)
    assert 0 < use.bytes <= bound.bytes and use.entries == bound.entries == 10 + 2
    # A tool that wrote there itself (as root) gains at most the bound.
    _write(tmp_path / "deps" / "r1" / "extra", 1 << 20)
    assert deps_use(tmp_path, bound) == bound
    assert deps_use(tmp_path / "elsewhere", bound) == DepsRoom()
    assert deps_use(tmp_path, DepsRoom()) == DepsRoom()


def test_attempt_watch__dependencies_artifacts_are_not_charged_to_the_tool(tmp_path: Path):
    made = [_write(tmp_path / "deps" / "r1" / "big.bin", 3 << 20)]
    made.append(_write(tmp_path / "deps" / "r1" / "sub" / "small.txt", 10))
    (tmp_path / "out").mkdir()
    _write(tmp_path / "out" / "mine", 512 << 10)

    def watch(room: DepsRoom) -> AttemptWatch:
        return AttemptWatch(
            ToolLimits(timeout_seconds=60, memory_mb=64, disk_mb=1),
            workdir=lambda: tmp_path,
            output_marker=lambda: None,
            note=lambda kind, data: None,
            log_extra={},
            deps_room=lambda: room,
        )

    charged = watch(deps_room({"r1": made}))
    used = charged.disk_used()
    assert used is not None and (512 << 10) <= used < (1 << 20)
    assert charged.check() is None
    # Without the room, the 3 MiB the platform copied in would stop the tool.
    assert watch(DepsRoom()).check() is StopReason.DISK
    # What the tool writes itself still counts in full.
    _write(tmp_path / "out" / "more", 600 << 10)
    assert charged.check() is StopReason.DISK
