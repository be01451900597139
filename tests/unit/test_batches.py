"""The batch rules that need no database: the dependency cap, and a page's rows as batches."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from runyard.submission.batches import ListedBatch, dependencies_problem, listed_batches

AT = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("dependencies", "cap", "refused"),
    [(0, 10, False), (10, 10, False), (11, 10, True), (100_000, 0, False)],
)
def test_dependencies_problem__table(dependencies: int, cap: int, refused: bool):
    problem = dependencies_problem(dependencies, cap)
    assert (problem is not None) == refused
    if problem is not None:
        assert f"names {dependencies} dependencies" in problem and f"at most {cap}" in problem


def test_listed_batches__counts_by_status_and_status_from_them():
    first, second, empty = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def row(batch: uuid.UUID, status: str | None, doomed: bool, runs: int) -> SimpleNamespace:
        return SimpleNamespace(
            id=batch, created_at=AT, size=5, status=status, dependency_failed=doomed, runs=runs
        )

    rows = [
        row(first, "cancelled", False, 1),
        row(first, "failed", True, 2),
        row(first, "succeeded", False, 2),
        row(second, "failed", False, 1),
        row(second, "failed", True, 3),
        row(empty, None, False, 0),  # its runs are gone
    ]
    assert listed_batches(rows) == [
        ListedBatch(first, "cancelled", AT, 5, {"cancelled": 1, "failed": 2, "succeeded": 2}),
        ListedBatch(second, "failed", AT, 5, {"failed": 4}),
        ListedBatch(empty, "succeeded", AT, 5, {}),
    ]
