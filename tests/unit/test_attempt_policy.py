"""The attempt owner's policies, its fenced log sink and its database clock (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runyard.attempts.flight import FencedLogSink, LeaseClock
from runyard.attempts.policy import OwnerPolicy
from runyard.domain.states import ErrorCode
from runyard.reads.metrics import Metrics

WORKER = OwnerPolicy.worker(lease_seconds=30, margin_seconds=5)
SYNC = OwnerPolicy.sync(lease_seconds=30)


@pytest.mark.parametrize(
    ("policy", "label", "chains", "caller_waits", "lost", "margin"),
    [
        (WORKER, "worker", True, False, ErrorCode.CONTAINER_LOST, 5.0),
        (SYNC, "sync", False, True, ErrorCode.API_LOST, 5.0),
    ],
    ids=["worker", "sync"],
)
def test_policy__says_what_differs_between_holders(
    policy: OwnerPolicy,
    label: str,
    chains: bool,
    caller_waits: bool,
    lost: ErrorCode,
    margin: float,
):
    assert (policy.label, policy.chains, policy.caller_waits) == (label, chains, caller_waits)
    assert (policy.lost_error_code, policy.margin_seconds) == (lost, margin)
    assert "running" in policy.lost_error.format(attempt=2, state="running")


@pytest.mark.parametrize("lease", [0.5, 30.0, 600.0])
def test_policy__one_retry_budget_for_every_holder__one_lease(lease: float):
    worker = OwnerPolicy.worker(lease_seconds=lease, margin_seconds=lease / 6)
    sync = OwnerPolicy.sync(lease_seconds=lease)
    assert worker.retry_budget_seconds == sync.retry_budget_seconds == lease


class Sink:
    def __init__(self) -> None:
        self.chunks: list[str] = []

    def resume_point(self, stream: str) -> str | None:
        return "2030-01-01T00:00:00Z" if stream == "stdout" else None

    def write(self, stream: str, text: str, until: str) -> bool:
        self.chunks.append(text)
        return True


def test_fenced_log_sink__writes_only_while_owned():
    sink, owned = Sink(), [True]
    fenced = FencedLogSink(sink, lambda: owned[0])
    assert fenced.write("stdout", "a", "t1")
    owned[0] = False
    assert not fenced.write("stdout", "b", "t2")
    assert sink.chunks == ["a"]
    assert fenced.resume_point("stdout") == "2030-01-01T00:00:00Z"


def test_lease_clock__ours_until_measured_then_the_databases():
    metrics = Metrics()
    clock = LeaseClock(metrics)
    assert clock.offset is None
    assert abs((clock.now() - datetime.now(UTC)).total_seconds()) < 5
    asked = datetime.now(UTC)
    clock.sample(asked, asked + timedelta(hours=1))
    assert clock.offset is not None and 3590 < clock.offset < 3610
    assert 3590 < (clock.now() - datetime.now(UTC)).total_seconds() < 3610
    assert metrics.db_clock_offset._value.get() == clock.offset
