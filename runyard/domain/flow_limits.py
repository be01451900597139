"""Flow control: which limits hold a run back, and how much room a scope has; pure rules.

A run is under the limits of up to three **scopes**: its tool (``tool:<tool>``, all tenants),
its tenant (``tenant:<tenant>``) and, when the caller set a ``concurrency_key``, that key of
its tool and tenant (``key:<tool>:<tenant>:<key>``). Each scope may have a **maximum in
flight** (runs released to the workers or running) and a **rate** (runs released per second,
a token bucket of one second's worth, at least one token). A run with no limited scope is
not held at all.

The gate releases held runs in claim order (priority, then age): a run goes when every one of
its scopes still has room (``room``: what the maximum leaves beside the runs in flight, and
the bucket's whole tokens), and takes one from each (``choose``). A run that one scope holds
back takes nothing from the others, so it never blocks runs behind it that those scopes admit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

T = TypeVar("T")

# A key the caller sets: printable, without the separator of scopes' parts.
CONCURRENCY_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@/+=-]{0,127}$"


@dataclass(frozen=True)
class Limit:
    """A scope's limits: the most in flight, and releases per second (None: no limit)."""

    max_running: int | None = None
    per_second: float | None = None

    @property
    def limited(self) -> bool:
        """Whether it limits anything."""
        return self.max_running is not None or self.per_second is not None

    @property
    def burst(self) -> float:
        """The bucket's size: one second's worth, at least one token."""
        return max(1.0, self.per_second or 0.0)


@dataclass(frozen=True)
class ToolFlow:
    """A tool's flow limits (``[tools.<name>.flow]``): its own, and each key's of it."""

    tool: Limit = Limit()
    key: Limit = Limit()


@dataclass(frozen=True)
class FlowConfig:
    """Every limit an operator set: per tool (and its keys), and for each tenant."""

    tools: Mapping[str, ToolFlow]
    tenant: Limit = Limit()

    def limit_of(self, scope: str) -> Limit:
        """The limits of ``scope`` as configured now (none for a scope no longer limited)."""
        kind, _, rest = scope.partition(":")
        if kind == "tenant":
            return self.tenant
        tool = rest.partition(":")[0] if kind == "key" else rest
        flow = self.tools.get(tool)
        if flow is None:
            return Limit()
        return flow.key if kind == "key" else flow.tool


def scopes_of(
    config: FlowConfig, tenant: str, tool: str, concurrency_key: str | None
) -> tuple[str, ...] | None:
    """The limited scopes of a new run (None: nothing limits it, it is never held)."""
    flow = config.tools.get(tool, ToolFlow())
    found = []
    if flow.tool.limited:
        found.append(f"tool:{tool}")
    if config.tenant.limited:
        found.append(f"tenant:{tenant}")
    if concurrency_key is not None and flow.key.limited:
        found.append(f"key:{tool}:{tenant}:{concurrency_key}")
    return tuple(sorted(found)) or None


def refilled(
    limit: Limit, tokens: float | None, refilled_at: datetime | None, now: datetime
) -> float | None:
    """The tokens of a scope's bucket at ``now`` (None: no rate, or a full bucket)."""
    if limit.per_second is None:
        return None
    if tokens is None or refilled_at is None:
        return limit.burst
    elapsed = max(0.0, (now - refilled_at).total_seconds())
    return min(limit.burst, tokens + elapsed * limit.per_second)


def room(limit: Limit, in_flight: int, tokens: float | None) -> int | None:
    """How many more runs of the scope may be released now (None: no bound)."""
    bounds = []
    if limit.max_running is not None:
        bounds.append(max(0, limit.max_running - in_flight))
    if tokens is not None:
        bounds.append(max(0, math.floor(tokens + 1e-9)))
    return min(bounds) if bounds else None


def choose(
    candidates: Sequence[tuple[T, Sequence[str]]], rooms: Mapping[str, int | None]
) -> list[T]:
    """The candidates (in claim order, each with its scopes) that the rooms admit, greedily:
    each one admitted takes one from the room of each of its scopes (None: no bound)."""
    left = dict(rooms)
    chosen = []
    for item, scopes in candidates:
        if all(left.get(scope, 0) != 0 for scope in scopes):
            chosen.append(item)
            for scope in scopes:
                room_left = left.get(scope)
                if room_left is not None:
                    left[scope] = room_left - 1
    return chosen


@dataclass(frozen=True)
class SubmitVerdict:
    """A submit rate's answer: whether it passes, the tokens left, and when one is back."""

    allowed: bool
    remaining: int
    retry_after_seconds: int


def submit_verdict(limit: Limit, tokens_after: float | None) -> SubmitVerdict:
    """What a submit is told once its tenant's bucket was asked for a token (``tokens_after``:
    the bucket after taking one, negative when none was there; None: no rate)."""
    if tokens_after is None or limit.per_second is None:
        return SubmitVerdict(True, 0, 0)
    if tokens_after >= 0:
        return SubmitVerdict(True, math.floor(tokens_after + 1e-9), 0)
    missing = -tokens_after
    return SubmitVerdict(False, 0, max(1, math.ceil(missing / limit.per_second)))


def rate_limit_headers(limit: Limit, verdict: SubmitVerdict) -> dict[str, str]:
    """The ``RateLimit-Policy``, ``RateLimit`` (and when refused ``Retry-After``) headers of
    a submit under a rate: a quota of one second's burst per second."""
    assert limit.per_second is not None
    quota = math.floor(limit.burst)
    reset = verdict.retry_after_seconds if not verdict.allowed else 1
    headers = {
        "RateLimit-Policy": f'"submits";q={quota};w=1',
        "RateLimit": f'"submits";r={verdict.remaining};t={reset}',
    }
    if not verdict.allowed:
        headers["Retry-After"] = str(verdict.retry_after_seconds)
    return headers
