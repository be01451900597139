"""The one rule for a running attempt whose owner is gone: what its new owner does with it.

Every adopter asks it: a worker adopting a run of its own engine, the reaper settling runs of
an engine declared dead, a sync-mode API process adopting a sync run of its engine. The
inputs are plain facts so any of them can state what it knows; ``docs/state_machine.md``
shows the table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from runyard.domain.states import ContainerState


class Action(enum.StrEnum):
    """What the adopter does with the attempt."""

    # The container exited: collect its outcome and finalize the run.
    FINALIZE = "finalize"
    # The container runs (or must be stopped now): wait on it under the same deadline.
    RESUME = "resume"
    # Nothing can be decided yet (the engine could not be asked): give it back, look later.
    LOOK_LATER = "look_later"
    # The container is gone or never ran and attempts remain: back to the queue.
    REQUEUE = "requeue"
    # The container is gone and the attempts are spent: failed (container_lost).
    FAIL = "fail"
    # A cancel was requested and there is no container left to stop: cancelled.
    CANCEL = "cancel"


@dataclass(frozen=True)
class AdoptionFacts:
    """What the adopter knows of the attempt."""

    # None: the engine could not be asked (down, unreachable, or not this adopter's engine).
    container: ContainerState | None
    # Whether the attempt's owner recorded that it was about to create the container.
    container_requested: bool
    cancel_requested: bool
    deadline_passed: bool
    # Whether attempts < max_attempts: a charged attempt may be retried.
    attempts_left: bool
    # The engine is given up for good: a container it may hold counts as lost.
    engine_dead: bool = False
    # The adopter can wait on a running container (a worker slot); else it looks again later.
    can_wait: bool = True


@dataclass(frozen=True)
class Verdict:
    """The adopter's action; ``charged``: the attempt counts against ``max_attempts``."""

    action: Action
    charged: bool = False
    # Remove the attempt's container first (created, never started: the tool never ran).
    discard: bool = False


def decide(facts: AdoptionFacts) -> Verdict:
    """Finalize, resume, look later, requeue (charged or not), fail, or cancel."""
    state = facts.container
    if state is None:
        if not facts.engine_dead:
            return Verdict(Action.LOOK_LATER)
        # No way to look, ever: a container that was asked for may have run and is lost.
        return _gone(facts, charged=facts.container_requested)
    if state is ContainerState.EXITED:
        return Verdict(Action.FINALIZE)
    if state is ContainerState.RUNNING:
        if facts.can_wait or facts.cancel_requested or facts.deadline_passed:
            return Verdict(Action.RESUME)
        return Verdict(Action.LOOK_LATER)
    if state is ContainerState.CREATED:
        # Its creator died between create and start; a requested attempt still counts.
        verdict = _gone(facts, charged=facts.container_requested)
        return Verdict(verdict.action, verdict.charged, discard=True)
    return _gone(facts, charged=facts.container_requested)


def _gone(facts: AdoptionFacts, *, charged: bool) -> Verdict:
    """No container will finish the attempt: cancel, retry, or fail."""
    if facts.cancel_requested:
        return Verdict(Action.CANCEL, charged=charged)
    if not charged or facts.attempts_left:
        return Verdict(Action.REQUEUE, charged=charged)
    return Verdict(Action.FAIL, charged=True)
