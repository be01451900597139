"""Bulk actions over runs: which runs each applies to, the plan and the report."""

from __future__ import annotations

import pytest

from runyard.domain.bulk import BulkAction, BulkOutcome, BulkPlan, acts_on, describe, plan
from runyard.domain.states import RunStatus

Q, R, S, F = RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED


@pytest.mark.parametrize(
    ("action", "status", "expected"),
    [
        (BulkAction.CANCEL, Q, True),
        (BulkAction.CANCEL, R, True),
        (BulkAction.CANCEL, S, False),
        (BulkAction.CANCEL, RunStatus.CANCELLED, False),
        (BulkAction.DELETE, Q, False),
        (BulkAction.DELETE, R, False),
        (BulkAction.DELETE, F, True),
        (BulkAction.DELETE, RunStatus.TIMED_OUT, True),
        (BulkAction.RERUN, Q, True),
        (BulkAction.RERUN, F, True),
    ],
)
def test_acts_on__by_status(action: BulkAction, status: RunStatus, expected: bool):
    assert acts_on(action, status) is expected


def test_plan__counts_runs_acted_on_and_skipped():
    assert plan(BulkAction.CANCEL, [Q, R, S, F]) == BulkPlan(act=2, skip=2)
    assert plan(BulkAction.DELETE, [Q, S]) == BulkPlan(act=1, skip=1)
    assert plan(BulkAction.RERUN, []) == BulkPlan(act=0, skip=0)


@pytest.mark.parametrize(
    ("action", "outcome", "line"),
    [
        (
            BulkAction.CANCEL,
            BulkOutcome(done=3, skipped=1),
            "3 cancelled, 1 skipped (already finished).",
        ),
        (
            BulkAction.DELETE,
            BulkOutcome(done=0, skipped=2),
            "0 deleted, 2 skipped (not finished; cancel them first).",
        ),
        (
            BulkAction.RERUN,
            BulkOutcome(done=2, gone=1, refused=1),
            "2 re-run, 1 no longer found, 1 refused (see the runs' tool and the tenant's caps).",
        ),
    ],
)
def test_describe__reports_what_happened(action: BulkAction, outcome: BulkOutcome, line: str):
    assert describe(action, outcome) == line
