"""The disk measure and the idle rule of a running attempt."""

from __future__ import annotations

import os
from pathlib import Path

from runyard.attempt_watch import MAX_ENTRIES, IdleAction, IdleClock, measure


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
    for index in range(MAX_ENTRIES + 1):
        (tmp_path / str(index)).touch()
    use = measure(tmp_path)
    assert use is not None and use.too_many_entries


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
