"""The suite's leftover check judges only the objects of its own runs."""

from __future__ import annotations

import pytest

from tests.conftest import suite_leftovers

OURS = "11111111-1111-1111-1111-111111111111"
THEIRS = "22222222-2222-2222-2222-222222222222"


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # A container of one of the suite's runs, still there at the end: a leak.
        ({}, {f"container:runyard-{OURS}-1": OURS}, {f"container:runyard-{OURS}-1"}),
        ({}, {f"volume:runyard-{OURS}-1": OURS}, {f"volume:runyard-{OURS}-1"}),
        # A dev stack's run on the same engine, started during the suite: not the suite's.
        ({}, {f"container:runyard-{THEIRS}-1": THEIRS}, set()),
        # Something that was there before the suite began: not the suite's either.
        ({f"container:runyard-{OURS}-1": OURS}, {f"container:runyard-{OURS}-1": OURS}, set()),
        # A labelled object without a run id (another tool's, or damaged labels).
        ({}, {"container:stray": ""}, set()),
        ({}, {}, set()),
    ],
)
def test_suite_leftovers__only_new_objects_of_the_suites_own_runs(before, after, expected):
    assert suite_leftovers(before, after, {OURS}) == expected
