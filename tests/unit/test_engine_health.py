"""Engine health: the backoff between probes, and the transitions a worker acts on."""

from __future__ import annotations

import logging

import pytest

from runyard.reads.metrics import Metrics
from runyard.runner import RunnerUnavailable
from worker.engine_health import EngineHealth, backoff_delay


@pytest.mark.parametrize(
    ("failures", "draw", "expected"),
    [
        (0, 1.0, 0.0),
        (1, 0.0, 0.5),  # equal jitter: half of the step at the lowest draw
        (1, 1.0, 1.0),
        (2, 1.0, 2.0),
        (3, 0.5, 3.0),
        (5, 1.0, 16.0),
        (6, 1.0, 30.0),  # capped
        (6, 0.0, 15.0),
        (10_000, 1.0, 30.0),  # no overflow however long the outage
    ],
)
def test_backoff_delay__capped_exponential_with_equal_jitter(
    failures: int, draw: float, expected: float
):
    assert backoff_delay(failures, 1.0, 30.0, draw) == pytest.approx(expected)


class Probe:
    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.down:
            raise RunnerUnavailable("connection refused")


def make(probe: Probe, changes: list[bool], metrics: Metrics) -> EngineHealth:
    return EngineHealth(
        probe,
        worker_id="w1",
        base_seconds=1.0,
        max_seconds=8.0,
        metrics=metrics,
        on_change=changes.append,
        draw=lambda: 1.0,
        clock=iter(range(0, 1000, 10)).__next__,
    )


def test_engine_health__reports_each_transition_once_and_grows_the_backoff(
    caplog: pytest.LogCaptureFixture,
):
    probe, changes, metrics = Probe(), list[bool](), Metrics()
    health = make(probe, changes, metrics)
    assert health.check() and health.healthy and changes == []
    assert health.next_delay() == 1.0  # the base while the engine answers

    probe.down = True
    with caplog.at_level(logging.INFO, logger="worker.engine_health"):
        delays = []
        for _ in range(5):
            assert not health.check()
            delays.append(health.next_delay())
    assert not health.healthy and changes == [False]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == ["engine_down"] + ["engine_probe"] * 4
    assert metrics.engine_up._value.get() == 0
    assert metrics.engine_probe_failures._value.get() == 5

    probe.down = False
    assert health.check() and health.healthy
    assert changes == [False, True]
    assert health.next_delay() == 1.0  # reset
    assert metrics.engine_up._value.get() == 1
    assert health.check() and changes == [False, True]  # no transition, no callback


def test_engine_health__trouble_pauses_until_a_later_probe_answers():
    probe, changes, metrics = Probe(), list[bool](), Metrics()
    health = make(probe, changes, metrics)
    health.trouble("cannot create container: connection aborted")
    assert not health.healthy and probe.calls == 0  # no probe at once: it may still answer
    assert changes == [False]
    assert health.check() and health.healthy and changes == [False, True]
