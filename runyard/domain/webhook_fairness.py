"""Who is sent to next, and each tenant's circuit breaker per destination: the pure rules of
delivery.

**Turns.** A free slot goes to the tenant with the fewest attempts in flight (all delivering
processes counted), its oldest due delivery first: the running-share rule of the job claim
(docs/decisions/0012-fair-tenants-by-running-share.md) with attempts in flight for running
runs. A tenant never has more than ``per_tenant`` attempts in flight, a destination never
more than ``per_destination``: one tenant's backlog, or one slow receiver, takes a few slots,
never all of them. The claim checks both caps again under its locks (``admit``), against
what every process has in flight by then.

**Breaker.** A tenant's destination (``host:port``) to which ``failures`` attempts in a row
connected and got no HTTP answer (a timeout, a refused or reset connection, a TLS failure)
opens for that tenant: its deliveries there are not attempted until a cool-down has passed
(doubling from ``cooldown`` to ``cooldown_max`` with each failure past the threshold), then
one of them probes it. Any answer closes it. Held deliveries are rescheduled to the end of
the cool-down, not counted as attempts, and given up like any other once that would be past
their retry window. An attempt that never connected (its name did not resolve, resolved to a
refused address, or the tenant's share of lookups was used up) says nothing of the
destination and is not counted. The breaker is the tenant's own: what one tenant's deliveries
do to a receiver (a path that never answers, a name server that never answers) holds back
only that tenant's deliveries there, never another tenant's.
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
    per_destination: int = 8

    @property
    def per_tenant_at_destination(self) -> int:
        """The most one tenant may hold of one destination: half its room, so a tenant whose
        attempts to a shared receiver never get an answer leaves the rest to the others."""
        return max(1, self.per_destination // 2)


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


# A tenant's breaker is kept per destination: (tenant, destination).
BreakerKey = tuple[str, str]


@dataclass(frozen=True)
class Picks:
    """What one claim should do."""

    claim: tuple[uuid.UUID, ...] = ()  # in turn order
    probes: Mapping[BreakerKey, uuid.UUID] = field(default_factory=dict)  # its probe
    defer: Mapping[uuid.UUID, datetime] = field(default_factory=dict)  # held until
    # Tenants under their cap whose offers left all wait for room at their destinations:
    # they may have deliveries for other destinations past the ones offered.
    waiting: frozenset[str] = frozenset()


def pick_deliveries(
    offers: Iterable[Offer],
    in_flight: Iterable[BreakerKey],
    breakers: Mapping[BreakerKey, Breaker],
    *,
    slots: int,
    caps: Caps,
    policy: BreakerPolicy,
    now: datetime,
) -> Picks:
    """Up to ``slots`` offers in turn order; offers to a destination whose breaker is open for
    their tenant are deferred.

    ``in_flight`` holds the (tenant, destination) of every attempt in progress. Each turn
    goes to the tenant with the fewest attempts in flight that has an offer it may send
    (under both caps), ties to the oldest offer; a tenant's offers go oldest first, skipping
    those whose destination is full or being probed for the tenant.
    """
    flying = list(in_flight)
    tenant_busy = Counter(tenant for tenant, _ in flying)
    destination_busy = Counter(destination for _, destination in flying)
    pair_busy = Counter(flying)
    gates: dict[BreakerKey, Gate] = {}
    queues: dict[str, list[Offer]] = {}
    defer: dict[uuid.UUID, datetime] = {}
    for offer in sorted(offers, key=lambda o: (o.due_at, str(o.id))):
        key = (offer.tenant, offer.destination)
        state = breakers.get(key, Breaker())
        gates[key] = gate(state, now, policy)
        if gates[key] is Gate.OPEN and state.open_until is not None:
            defer[offer.id] = state.open_until
        else:
            queues.setdefault(offer.tenant, []).append(offer)

    def room(offer: Offer) -> bool:
        key = (offer.tenant, offer.destination)
        if gates[key] is Gate.PROBE and pair_busy[key]:
            return False  # one probe at a time
        if pair_busy[key] >= caps.per_tenant_at_destination:
            return False
        return destination_busy[offer.destination] < caps.per_destination

    claim: list[uuid.UUID] = []
    probes: dict[BreakerKey, uuid.UUID] = {}
    waiting: frozenset[str] = frozenset()
    while len(claim) < slots:
        best: tuple[tuple[int, datetime, str], Offer] | None = None
        for tenant, queue in queues.items():
            if tenant_busy[tenant] >= caps.per_tenant:
                continue
            candidate = next((o for o in queue if room(o)), None)
            if candidate is None:
                continue
            rank = (tenant_busy[tenant], candidate.due_at, tenant)
            if best is None or rank < best[0]:
                best = (rank, candidate)
        if best is None:
            waiting = frozenset(
                tenant
                for tenant, queue in queues.items()
                if queue and tenant_busy[tenant] < caps.per_tenant
            )
            break
        _, offer = best
        pair = (offer.tenant, offer.destination)
        queues[offer.tenant].remove(offer)
        claim.append(offer.id)
        tenant_busy[offer.tenant] += 1
        destination_busy[offer.destination] += 1
        pair_busy[pair] += 1
        if gates[pair] is Gate.PROBE:
            probes[pair] = offer.id
    return Picks(tuple(claim), probes, defer, waiting)


def admit(picked: Iterable[Offer], in_flight: Iterable[BreakerKey], caps: Caps) -> list[Offer]:
    """The picked offers that still fit both caps, in order, given what is in flight now.

    A claim picks from a read that locks nothing, so another process may have claimed for the
    same tenant or destination since; the claim calls this again under its locks with the
    attempts in flight at that moment, so the caps hold across processes.
    """
    flying = list(in_flight)
    tenant_busy = Counter(tenant for tenant, _ in flying)
    destination_busy = Counter(destination for _, destination in flying)
    pair_busy = Counter(flying)
    admitted: list[Offer] = []
    for offer in picked:
        pair = (offer.tenant, offer.destination)
        if tenant_busy[offer.tenant] >= caps.per_tenant:
            continue
        if destination_busy[offer.destination] >= caps.per_destination:
            continue
        if pair_busy[pair] >= caps.per_tenant_at_destination:
            continue
        admitted.append(offer)
        tenant_busy[offer.tenant] += 1
        destination_busy[offer.destination] += 1
        pair_busy[pair] += 1
    return admitted
