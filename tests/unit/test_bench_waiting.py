"""A benchmark waits for its drain without a busy poll that would cost the process it measures."""

from __future__ import annotations

import threading
import time

import pytest

from bench.common import wait_for_count


class Counter:
    """A count that another thread advances; it counts how often it was read."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.value


def test_wait_for_count__returns_at_once_when_the_target_is_reached():
    counter = Counter(10)

    assert wait_for_count(counter, 10, 5, "the drain") < 0.05
    assert counter.reads == 1


def test_wait_for_count__sees_the_end_with_far_fewer_reads_than_a_fine_poll():
    counter = Counter()
    stop = threading.Event()

    def advance() -> None:
        while counter.value < 200 and not stop.is_set():
            time.sleep(0.002)
            counter.value += 1

    thread = threading.Thread(target=advance)
    thread.start()
    try:
        wait_for_count(counter, 200, 30, "the drain")
        assert counter.value == 200
        # At least 0.4 s of advancing: a 2 ms poll reads some 200 times.
        assert counter.reads < 100
    finally:
        stop.set()
        thread.join()


def test_wait_for_count__names_what_it_waited_for_on_timeout():
    with pytest.raises(TimeoutError, match="the drain"):
        wait_for_count(Counter(3), 4, 0.1, "the drain")
