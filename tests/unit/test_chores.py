"""The chore loop: each chore on its interval, a quiet one slept through until poked."""

from __future__ import annotations

import threading

from runyard.maintenance.chores import Chore, Chores


def test_run_due__runs_each_chore_then_waits_its_interval():
    calls: list[str] = []
    chores = Chores([Chore("a", 60, lambda: calls.append("a")), Chore("b", 30, lambda: 0)])
    wait = chores.run_due()
    assert calls == ["a"]
    assert 29 < wait <= 30  # b, the nearer
    chores.run_due()
    assert calls == ["a"]  # not due again


def test_run_due__a_quiet_chore_is_not_run_and_its_quiet_time_is_slept():
    quiet = [600.0]
    calls: list[str] = []
    chore = Chore("gate", 0.1, lambda: calls.append("gate"), quiet_for=lambda: quiet[0])
    chores = Chores([chore])
    wait = chores.run_due()
    assert calls == []
    assert 599 < wait <= 600
    quiet[0] = 0.0
    assert chores.run_due() <= 0.1
    assert calls == ["gate"]


def test_poke__wakes_the_loop_for_a_chore_no_longer_quiet():
    quiet = [3600.0]
    ran = threading.Event()
    chores = Chores([Chore("gate", 0.1, ran.set, quiet_for=lambda: quiet[0])])
    chores.start()
    try:
        assert not ran.wait(0.3)  # quiet: the loop sleeps for an hour
        quiet[0] = 0.0
        chores.poke()
        assert ran.wait(10)
    finally:
        chores.stop()


def test_stop__ends_a_loop_asleep_on_a_quiet_chore():
    chores = Chores([Chore("gate", 0.1, lambda: 0, quiet_for=lambda: 3600.0)])
    chores.start()
    chores.stop(timeout=10)
    assert not chores._thread.is_alive()


class _StopBeforeClear(threading.Event):
    """The loop's wake-up, with ``stop`` arriving just before the loop clears it."""

    def __init__(self, chores: Chores) -> None:
        super().__init__()
        self.chores = chores
        self.raced = False

    def clear(self) -> None:
        if not self.raced and self.chores._thread.ident is not None:
            self.raced = True
            self.chores._stop.set()  # what stop() does, before it wakes the loop
            self.set()
        super().clear()


def test_stop__between_the_loops_check_and_its_clear_still_ends_it():
    chores = Chores([Chore("gate", 0.1, lambda: 0, quiet_for=lambda: 3600.0)])
    chores._poked = _StopBeforeClear(chores)
    chores.start()
    chores._thread.join(10)
    assert not chores._thread.is_alive()  # not asleep for the hour the chore rests


def test_run_due__a_chore_that_cannot_say_how_long_it_rests_runs_on_its_interval():
    ran: list[int] = []

    def broken() -> float:
        raise RuntimeError("no idea")

    chores = Chores([Chore("gate", 0.5, lambda: ran.append(1), quiet_for=broken)])
    assert chores.run_due() <= 0.5
    assert ran == [1]
