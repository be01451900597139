"""Who is sent to next, and each destination's circuit breaker: the pure rules of delivery.

**Turns.** A free slot goes to the tenant with the fewest attempts in flight (all delivering
processes counted), its oldest due delivery first: the running-share rule of the job claim
(docs/decisions/0012-fair-tenants-by-running-share.md) with attempts in flight for running
runs. A tenant never has more than ``per_tenant`` attempts in flight, a destination never
more than ``per_destination``: one tenant's backlog, or one slow receiver, takes a few slots,
never all of them.

**Breaker.** A destination (``host:port``) that leaves ``failures`` attempts in a row without
an HTTP answer (a timeout, a refused connection, a name that does not resolve) opens: its
deliveries are not attempted until a cool-down has passed (doubling from ``cooldown`` to
``cooldown_max`` with each failure past the threshold), then one of them probes it. Any answer
closes it. Held deliveries are rescheduled to the end of the cool-down, not counted as
attempts, and given up like any other once that would be past their retry window.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Offer:
    """A due delivery the claim may take."""

    id: uuid.UUID
    tenant: str
    destination: str
    due_at: datetime


@dataclass(frozen=True)
class Caps:
    """The most attempts in flight at once, per tenant and per destination."""

    per_tenant: int = 4
    per_destination: int = 4


@dataclass(frozen=True)
class BreakerPolicy:
    """When a destination's breaker opens and how long it stays open."""

    failures: int = 5
    cooldown_seconds: float = 60.0
    cooldown_max_seconds: float = 900.0


@dataclass(frozen=True)
class Breaker:
    """A destination's state: consecutive attempts without an answer; open until when."""

    failures: int = 0
    open_until: datetime | None = None


class Gate(enum.Enum):
    """What a destination's breaker lets through now."""

    CLOSED = "closed"  # any number of attempts, up to the destination cap
    OPEN = "open"  # none: its deliveries wait for the cool-down
    PROBE = "probe"  # one attempt, when none is in flight


def gate(state: Breaker, now: datetime, policy: BreakerPolicy) -> Gate:
    """The breaker's gate at ``now``."""
    if state.failures < policy.failures:
        return Gate.CLOSED
    if state.open_until is not None and now < state.open_until:
        return Gate.OPEN
    return Gate.PROBE


def cooldown(failures: int, policy: BreakerPolicy) -> float:
    """Seconds a destination stays open after its ``failures``-th failure in a row."""
    past = max(failures - policy.failures, 0)
    return float(min(policy.cooldown_max_seconds, policy.cooldown_seconds * 2 ** min(past, 62)))


def after_attempt(
    state: Breaker, *, answered: bool, now: datetime, policy: BreakerPolicy
) -> Breaker:
    """The state after an attempt: an answer (any status) closes; no answer counts one more
    failure, and from the threshold on opens for the cool-down."""
    if answered:
        return Breaker()
    failures = state.failures + 1
    if failures < policy.failures:
        return Breaker(failures)
    return Breaker(failures, now + timedelta(seconds=cooldown(failures, policy)))


@dataclass(frozen=True)
class Picks:
    """What one claim should do."""

    claim: tuple[uuid.UUID, ...] = ()  # in turn order
    probes: Mapping[str, uuid.UUID] = field(default_factory=dict)  # destination -> its probe
    defer: Mapping[uuid.UUID, datetime] = field(default_factory=dict)  # held until


def pick_deliveries(
    offers: Iterable[Offer],
    in_flight: Iterable[tuple[str, str]],
    breakers: Mapping[str, Breaker],
    *,
    slots: int,
    caps: Caps,
    policy: BreakerPolicy,
    now: datetime,
) -> Picks:
    """Up to ``slots`` offers in turn order; offers for an open destination are deferred.

    ``in_flight`` holds the (tenant, destination) of every attempt in progress. Each turn
    goes to the tenant with the fewest attempts in flight that has an offer it may send
    (under both caps), ties to the oldest offer; a tenant's offers go oldest first, skipping
    those whose destination is full.
    """
    tenant_busy = Counter(tenant for tenant, _ in in_flight)
    destination_busy = Counter(destination for _, destination in in_flight)
    gates: dict[str, Gate] = {}
    queues: dict[str, list[Offer]] = {}
    defer: dict[uuid.UUID, datetime] = {}
    for offer in sorted(offers, key=lambda o: (o.due_at, str(o.id))):
        state = breakers.get(offer.destination, Breaker())
        gates[offer.destination] = gate(state, now, policy)
        if gates[offer.destination] is Gate.OPEN and state.open_until is not None:
            defer[offer.id] = state.open_until
        else:
            queues.setdefault(offer.tenant, []).append(offer)

    def room(destination: str) -> bool:
        if gates[destination] is Gate.PROBE:
            return destination_busy[destination] == 0
        return destination_busy[destination] < caps.per_destination

    claim: list[uuid.UUID] = []
    probes: dict[str, uuid.UUID] = {}
    while len(claim) < slots:
        best: tuple[tuple[int, datetime, str], Offer] | None = None
        for tenant, queue in queues.items():
            if tenant_busy[tenant] >= caps.per_tenant:
                continue
            candidate = next((o for o in queue if room(o.destination)), None)
            if candidate is None:
                continue
            key = (tenant_busy[tenant], candidate.due_at, tenant)
            if best is None or key < best[0]:
                best = (key, candidate)
        if best is None:
            break
        _, offer = best
        queues[offer.tenant].remove(offer)
        claim.append(offer.id)
        tenant_busy[offer.tenant] += 1
        destination_busy[offer.destination] += 1
        if gates[offer.destination] is Gate.PROBE:
            probes[offer.destination] = offer.id
    return Picks(tuple(claim), probes, defer)
