"""What a bulk action over runs does to each run, decided from its status alone."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from runyard.domain.states import TERMINAL_STATUSES, RunStatus

# "All matching" acts on at most this many runs (the newest), so one form post stays short.
BULK_CAP = 500


class BulkAction(StrEnum):
    """What a bulk form asks for."""

    CANCEL = "cancel"
    DELETE = "delete"
    RERUN = "rerun"


# What each action does, in words for the confirmation and the report.
ACTION_WORDS = {
    BulkAction.CANCEL: ("cancel", "cancelled", "already finished"),
    BulkAction.DELETE: ("delete", "deleted", "not finished; cancel them first"),
    BulkAction.RERUN: ("re-run", "re-run", "refused"),
}


def acts_on(action: BulkAction, status: RunStatus) -> bool:
    """Whether ``action`` applies to a run in ``status`` (else the run is skipped): cancel
    stops queued and running runs, delete removes finished ones, re-run starts any run again."""
    if action is BulkAction.CANCEL:
        return status not in TERMINAL_STATUSES
    if action is BulkAction.DELETE:
        return status in TERMINAL_STATUSES
    return True


@dataclass(frozen=True)
class BulkPlan:
    """How many runs an action applies to and how many it skips."""

    act: int
    skip: int


def plan(action: BulkAction, statuses: Iterable[RunStatus]) -> BulkPlan:
    """Count the runs ``action`` would act on and those it would skip."""
    decided = [acts_on(action, status) for status in statuses]
    return BulkPlan(act=sum(decided), skip=len(decided) - sum(decided))


@dataclass(frozen=True)
class BulkOutcome:
    """What a bulk action did: runs done, skipped by status, gone meanwhile, refused."""

    done: int = 0
    skipped: int = 0
    gone: int = 0
    refused: int = 0


def describe(action: BulkAction, outcome: BulkOutcome) -> str:
    """The report line, e.g. ``"3 cancelled, 1 skipped (already finished)."``."""
    _, past, skip_reason = ACTION_WORDS[action]
    parts = [f"{outcome.done} {past}"]
    if outcome.skipped:
        parts.append(f"{outcome.skipped} skipped ({skip_reason})")
    if outcome.gone:
        parts.append(f"{outcome.gone} no longer found")
    if outcome.refused:
        parts.append(f"{outcome.refused} refused (see the runs' tool and the tenant's caps)")
    return ", ".join(parts) + "."
