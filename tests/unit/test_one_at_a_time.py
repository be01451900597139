"""Calls started and watched, never waited on: one at a time, overdue flagged once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from worker.bounded import OneAtATime


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def test_one_at_a_time__runs_the_call_without_waiting():
    calls = OneAtATime("t")
    done = threading.Event()
    assert calls.start(done.set)
    assert done.wait(5)
    wait_until(lambda: calls.busy_for() is None, 5)
    assert calls.thread_id is None


def test_one_at_a_time__no_second_call_while_one_is_stuck_and_overdue_once():
    calls = OneAtATime("t")
    release = threading.Event()

    def stuck() -> None:
        release.wait(10)

    assert calls.start(stuck)
    assert not calls.start(lambda: None)
    assert calls.thread_id is not None
    wait_until(lambda: calls.overdue(0.05), 5)
    assert not calls.overdue(0.05)  # flagged once per call
    release.set()
    wait_until(lambda: calls.busy_for() is None, 5)
    ran = threading.Event()
    assert calls.start(ran.set)
    assert ran.wait(5)


def test_one_at_a_time__an_error_in_the_call_leaves_it_usable():
    calls = OneAtATime("t")

    def boom() -> None:
        raise KeyError("x")

    assert calls.start(boom)
    wait_until(lambda: calls.busy_for() is None, 5)
    ran = threading.Event()
    assert calls.start(ran.set)
    assert ran.wait(5)
