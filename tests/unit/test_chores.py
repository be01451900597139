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
    stopped = threading.Thread(target=chores.stop, kwargs={"timeout": 10})
    stopped.start()
    stopped.join(15)
    assert not stopped.is_alive()
