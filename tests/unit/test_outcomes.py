"""The outcome decision, row by row (docs/runner-contract.md, Outcomes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runyard.domain.outcomes import (
    ExitFacts,
    StopReason,
    ToolLimits,
    Verdict,
    decide_exit,
    decide_result,
)
from runyard.domain.states import RunStatus

DEADLINE = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
BEFORE = DEADLINE - timedelta(seconds=5)
AFTER = DEADLINE + timedelta(seconds=1)
LIMITS = ToolLimits(timeout_seconds=30, memory_mb=64, disk_mb=10, idle_timeout_seconds=8)
MB = 1 << 20


def facts(exit_code: int = 0, **more: object) -> ExitFacts:
    base: dict[str, object] = {
        "exit_code": exit_code,
        "oom_killed": False,
        "finished_at": BEFORE,
        "deadline_at": DEADLINE,
    }
    base.update(more)
    return ExitFacts(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # exit 0: read result.json, then decide_result
        (facts(0), (RunStatus.SUCCEEDED, None, True)),
        (facts(0, disk_used_bytes=20 * MB), (RunStatus.SUCCEEDED, None, True)),
        (facts(0, cancel_requested=True), (RunStatus.SUCCEEDED, None, True)),
        # exit != 0
        (facts(3), (RunStatus.FAILED, "tool_failed", False)),
        (facts(1, disk_used_bytes=9 * MB), (RunStatus.FAILED, "tool_failed", False)),
        # killed by the memory limit
        (facts(137, oom_killed=True), (RunStatus.FAILED, "oom_killed", False)),
        # still running at the deadline: stopped by the owner, or found exited after it
        (facts(143, stopped_for=StopReason.TIMED_OUT), (RunStatus.TIMED_OUT, "timed_out", False)),
        (facts(0, stopped_for=StopReason.TIMED_OUT), (RunStatus.TIMED_OUT, "timed_out", False)),
        (facts(137, finished_at=AFTER), (RunStatus.TIMED_OUT, "timed_out", False)),
        (facts(0, finished_at=AFTER), (RunStatus.SUCCEEDED, None, True)),
        (
            facts(137, finished_at=AFTER, oom_killed=True),
            (RunStatus.TIMED_OUT, "timed_out", False),
        ),
        # cancelled: stopped here, or stopped by a previous owner that then died
        (facts(143, stopped_for=StopReason.CANCELLED), (RunStatus.CANCELLED, "cancelled", False)),
        (facts(0, stopped_for=StopReason.CANCELLED), (RunStatus.CANCELLED, "cancelled", False)),
        (facts(143, cancel_requested=True), (RunStatus.CANCELLED, "cancelled", False)),
        (facts(3, cancel_requested=True), (RunStatus.FAILED, "tool_failed", False)),
        (
            facts(137, cancel_requested=True, oom_killed=True),
            (RunStatus.FAILED, "oom_killed", False),
        ),
        (
            facts(137, cancel_requested=True, finished_at=AFTER),
            (RunStatus.CANCELLED, "cancelled", False),
        ),
        # silent past idle_timeout_seconds
        (facts(143, stopped_for=StopReason.IDLE), (RunStatus.TIMED_OUT, "idle_timeout", False)),
        # wrote past disk_mb: stopped here, or an adopter finds the fill
        (facts(137, stopped_for=StopReason.DISK), (RunStatus.FAILED, "disk_limit_exceeded", False)),
        (
            facts(153, disk_used_bytes=11 * MB),
            (RunStatus.FAILED, "disk_limit_exceeded", False),
        ),
        (
            facts(137, oom_killed=True, stopped_for=StopReason.DISK),
            (RunStatus.FAILED, "disk_limit_exceeded", False),
        ),
    ],
)
def test_decide_exit__table(case: ExitFacts, expected: tuple[RunStatus, str | None, bool]):
    verdict = decide_exit(case, LIMITS)
    assert (verdict.status, verdict.error_code, verdict.read_result) == expected
    if verdict.status is not RunStatus.SUCCEEDED:
        assert verdict.error


def test_decide_exit__messages_name_the_limit():
    assert decide_exit(facts(1, stopped_for=StopReason.TIMED_OUT), LIMITS).error == (
        "the tool ran past its 30 s timeout"
    )
    assert decide_exit(facts(1, stopped_for=StopReason.IDLE), LIMITS).error == (
        "the tool printed nothing for 8 s"
    )
    assert decide_exit(facts(1, stopped_for=StopReason.DISK), LIMITS).error == (
        "the tool wrote more than 10 MB under /runyard"
    )
    assert decide_exit(facts(9, oom_killed=True), LIMITS).error == (
        "the tool ran out of memory (64 MB)"
    )
    assert decide_exit(facts(9), LIMITS).error == "the tool exited with code 9"
    unattributed = decide_exit(facts(137), LIMITS)
    assert (unattributed.error_code, "memory limit (64 MB)" in str(unattributed.error)) == (
        "tool_failed",
        True,
    )


def test_decide_result__invalid_or_succeeded():
    assert decide_result(None) == Verdict(RunStatus.SUCCEEDED)
    refused = decide_result("result.json: NaN is not JSON at line 1")
    assert (refused.status, refused.error_code, refused.error) == (
        RunStatus.FAILED,
        "invalid_result",
        "result.json: NaN is not JSON at line 1",
    )


def test_tool_limits__of_a_snapshot():
    limits = ToolLimits.of({"timeout_seconds": 5, "memory_mb": 32, "disk_mb": 7})
    assert limits == ToolLimits(5, 32, 7, None)
    assert ToolLimits.of({"idle_timeout_seconds": 4}).idle_timeout_seconds == 4
    assert ToolLimits.of({}).disk_mb == 1024
