"""What differs between the processes that own attempts: a small frozen value, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from runyard.domain.states import ErrorCode


@dataclass(frozen=True)
class OwnerPolicy:
    """How an ``AttemptOwner`` behaves where a worker and a sync-mode API process differ.

    Everything else, the finalize's retry budget included, is one rule for both
    (docs/decisions/0018-one-attempt-owner.md).
    """

    # What logs call this owner's attempts ("worker attempt crashed", "sync attempt ...").
    label: str
    lease_seconds: float
    # The part of the lease held in reserve: the owner stops acting this long before the
    # lease it last renewed runs out (the time a renewal may take).
    margin_seconds: float
    # A finalize may also claim the slot's next job (``FINALIZE_AND_CLAIM``).
    chains: bool
    # Someone waits on the attempt's answer (the request that submitted a sync run): an engine
    # failure on a fresh attempt fails it as ``infrastructure_error``, and a passing error in
    # the owner's own code fails it as ``internal_error``, instead of giving the lease back
    # for a later owner to decide.
    caller_waits: bool
    # How a charged attempt whose container an adopter found gone is put back or failed.
    lost_error_code: ErrorCode = ErrorCode.CONTAINER_LOST
    lost_error: str = "the container of attempt {attempt} was {state}"

    @property
    def retry_budget_seconds(self) -> float:
        """How long the start mark and the finalize retry passing errors: one lease from the
        first try, and never past the lease clock. Then the lease goes back and the next
        owner finishes the run from its container."""
        return self.lease_seconds

    @classmethod
    def worker(cls, *, lease_seconds: float, margin_seconds: float) -> OwnerPolicy:
        """A worker's slot: chains its next claim; engine trouble gives the lease back."""
        return cls(
            label="worker",
            lease_seconds=lease_seconds,
            margin_seconds=margin_seconds,
            chains=True,
            caller_waits=False,
        )

    @classmethod
    def sync(cls, *, lease_seconds: float) -> OwnerPolicy:
        """A sync-mode API process: the caller waits, nothing is chained, a lost container is
        ``api_lost``; a sixth of the lease is kept in reserve."""
        return cls(
            label="sync",
            lease_seconds=lease_seconds,
            margin_seconds=lease_seconds / 6,
            chains=False,
            caller_waits=True,
            lost_error_code=ErrorCode.API_LOST,
            lost_error="the API process running the tool stopped; its container was {state}",
        )
