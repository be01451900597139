"""Bounded calls: a value, an error, a timeout, and no second call while one is stuck."""

from __future__ import annotations

import threading

import pytest

from worker.bounded import BoundedCall, CallBusy, CallTimedOut


def test_bounded_call__returns_the_value_and_raises_the_error():
    call = BoundedCall("t")
    assert call.run(lambda: 42, timeout=5) == 42

    def boom() -> int:
        raise KeyError("x")

    with pytest.raises(KeyError):
        call.run(boom, timeout=5)
    assert call.thread_id is None


def test_bounded_call__a_stuck_call_times_out_and_blocks_the_next():
    call = BoundedCall("t")
    release = threading.Event()
    with pytest.raises(CallTimedOut):
        call.run(lambda: release.wait(10), timeout=0.05)
    assert call.thread_id is not None
    with pytest.raises(CallBusy):
        call.run(lambda: 1, timeout=5)
    release.set()
    thread_id = call.thread_id
    for thread in threading.enumerate():
        if thread.ident == thread_id:
            thread.join(5)
    assert call.run(lambda: 2, timeout=5) == 2
