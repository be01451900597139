"""The adoption rule, row by row as docs/state_machine.md states it."""

from __future__ import annotations

import itertools

import pytest

from runyard.domain.adoption import Action, AdoptionFacts, Verdict, decide
from runyard.domain.states import ContainerState

MISSING, CREATED, RUNNING, EXITED = (
    ContainerState.MISSING,
    ContainerState.CREATED,
    ContainerState.RUNNING,
    ContainerState.EXITED,
)


def facts(
    container: ContainerState | None,
    *,
    requested: bool = True,
    cancel: bool = False,
    late: bool = False,
    left: bool = True,
    dead: bool = False,
    wait: bool = True,
) -> AdoptionFacts:
    return AdoptionFacts(
        container=container,
        container_requested=requested,
        cancel_requested=cancel,
        deadline_passed=late,
        attempts_left=left,
        engine_dead=dead,
        can_wait=wait,
    )


ROWS = [
    # container unknown: the engine could not be asked
    ("unknown, engine may come back", facts(None), Verdict(Action.LOOK_LATER)),
    (
        "unknown, engine may come back, even past the deadline",
        facts(None, late=True, cancel=True, left=False),
        Verdict(Action.LOOK_LATER),
    ),
    (
        "unknown, engine dead, never requested",
        facts(None, dead=True, requested=False, left=False),
        Verdict(Action.REQUEUE, charged=False),
    ),
    (
        "unknown, engine dead, never requested, cancel",
        facts(None, dead=True, requested=False, cancel=True),
        Verdict(Action.CANCEL, charged=False),
    ),
    (
        "unknown, engine dead, requested, attempts left",
        facts(None, dead=True),
        Verdict(Action.REQUEUE, charged=True),
    ),
    (
        "unknown, engine dead, requested, attempts spent",
        facts(None, dead=True, left=False),
        Verdict(Action.FAIL, charged=True),
    ),
    (
        "unknown, engine dead, requested, cancel",
        facts(None, dead=True, cancel=True, left=False),
        Verdict(Action.CANCEL, charged=True),
    ),
    # exited: the outcome stands, whatever came since
    ("exited", facts(EXITED), Verdict(Action.FINALIZE)),
    (
        "exited, cancel and deadline passed, no waiting",
        facts(EXITED, cancel=True, late=True, wait=False, left=False),
        Verdict(Action.FINALIZE),
    ),
    # running
    ("running, adopter can wait", facts(RUNNING), Verdict(Action.RESUME)),
    (
        "running, adopter can wait, past deadline",
        facts(RUNNING, late=True),
        Verdict(Action.RESUME),
    ),
    (
        "running, adopter cannot wait, within deadline",
        facts(RUNNING, wait=False),
        Verdict(Action.LOOK_LATER),
    ),
    (
        "running, adopter cannot wait, deadline passed: stop it",
        facts(RUNNING, wait=False, late=True),
        Verdict(Action.RESUME),
    ),
    (
        "running, adopter cannot wait, cancel: stop it",
        facts(RUNNING, wait=False, cancel=True),
        Verdict(Action.RESUME),
    ),
    # created, never started: remove it, the tool never ran
    (
        "created, requested, attempts left",
        facts(CREATED),
        Verdict(Action.REQUEUE, charged=True, discard=True),
    ),
    (
        "created, requested, attempts spent",
        facts(CREATED, left=False),
        Verdict(Action.FAIL, charged=True, discard=True),
    ),
    (
        "created, never requested",
        facts(CREATED, requested=False, left=False),
        Verdict(Action.REQUEUE, charged=False, discard=True),
    ),
    (
        "created, cancel",
        facts(CREATED, cancel=True),
        Verdict(Action.CANCEL, charged=True, discard=True),
    ),
    # missing
    (
        "missing, never requested: the attempt never began",
        facts(MISSING, requested=False, left=False),
        Verdict(Action.REQUEUE, charged=False),
    ),
    (
        "missing, never requested, cancel",
        facts(MISSING, requested=False, cancel=True),
        Verdict(Action.CANCEL, charged=False),
    ),
    (
        "missing, requested, attempts left: container lost",
        facts(MISSING),
        Verdict(Action.REQUEUE, charged=True),
    ),
    (
        "missing, requested, attempts spent",
        facts(MISSING, left=False),
        Verdict(Action.FAIL, charged=True),
    ),
    (
        "missing, requested, cancel",
        facts(MISSING, cancel=True, left=False),
        Verdict(Action.CANCEL, charged=True),
    ),
]


@pytest.mark.parametrize(("case", "given", "expected"), ROWS, ids=[row[0] for row in ROWS])
def test_decide__rule_table(case: str, given: AdoptionFacts, expected: Verdict):
    assert decide(given) == expected


ALL_FACTS = [
    AdoptionFacts(state, *flags)
    for state in (None, *ContainerState)
    for flags in itertools.product((False, True), repeat=6)
]


def test_decide__never_charges_an_attempt_whose_container_was_never_requested():
    for given in ALL_FACTS:
        verdict = decide(given)
        if not given.container_requested:
            assert not verdict.charged and verdict.action is not Action.FAIL, given


def test_decide__waits_only_on_a_running_container_and_collects_only_an_exited_one():
    for given in ALL_FACTS:
        verdict = decide(given)
        assert (verdict.action is Action.RESUME) <= (given.container is RUNNING), given
        assert (verdict.action is Action.FINALIZE) == (given.container is EXITED), given
        assert verdict.discard == (given.container is CREATED), given
        if given.engine_dead and given.container is None:
            assert verdict.action is not Action.LOOK_LATER, given
