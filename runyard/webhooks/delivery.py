"""Lifecycle webhooks: deliver the outbox that triggers fill when runs start and end, and the
deadline notices each pass writes, one run's deliveries in the order they were written.

Each delivery is POSTed with the run as ``GET /v1/runs/{id}`` shows it and the ``event`` it
reports (``delivery_body``), signed the Standard
Webhooks way (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``: HMAC-SHA256 with
the tenant's secret), at least once: rows are claimed with FOR UPDATE SKIP LOCKED under a
lease, so several delivering processes share the work, and one that dies leaves its
deliveries due again when their lease runs out. A failed attempt (an error, a timeout, or
any status but 2xx, a redirect included) is retried after a doubling backoff until the
retry window after the run's end has passed. Claims take turns between tenants under caps
per tenant and per destination that hold across processes, and a destination that keeps
failing for a tenant is held back for that tenant by its circuit breaker
(``runyard.domain.webhook_fairness``), so a dead receiver costs its own tenant.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pydantic
from sqlalchemy import Engine
from standardwebhooks.webhooks import Webhook

import runyard
from runyard.domain.webhook_fairness import (
    Breaker,
    BreakerKey,
    BreakerPolicy,
    Caps,
    Offer,
    Picks,
    admit,
    after_attempt,
    pick_deliveries,
)
from runyard.platform.db import autocommit
from runyard.platform.settings import Settings
from runyard.platform.tracing import Attributes, tracing
from runyard.reads.metrics import Metrics, Role
from runyard.reads.run_view import RunView, read_run_spec, read_run_view
from runyard.traces.context import trace_of
from runyard.usage.ledger import UsageLedger
from runyard.webhooks.http import HttpAttempt, post
from runyard.webhooks.resolver import BoundedResolver
from runyard.webhooks.sql import (
    CLAIM_DELIVERIES,
    CLOSE_DESTINATION,
    DEFER_DELIVERIES,
    DELIVERY_OFFERS,
    DESTINATION_STATES,
    ENQUEUE_DEADLINE_NOTICES,
    IN_FLIGHT,
    LOCK_CLAIM,
    LOCK_DESTINATION,
    MORE_OFFERS,
    PRUNE_DESTINATIONS,
    SAVE_DESTINATION,
    SETTLE_DELIVERY,
)
from runyard.webhooks.urls import (
    STRICT,
    BadCallbackUrl,
    CallbackUrl,
    DestinationPolicy,
    Resolver,
    destination_key,
    parse_callback_url,
)

logger = logging.getLogger(__name__)

# The API's serializer of a run, without the API: the same fields and types give the same JSON.
_RUN_JSON: pydantic.TypeAdapter[RunView] = pydantic.TypeAdapter(RunView)

Sender = Callable[..., HttpAttempt]


def run_json(view: RunView) -> bytes:
    """The run as ``GET /v1/runs/{id}`` shows it, as JSON bytes."""
    return _RUN_JSON.dump_json(view)


def delivery_body(view: RunView, event: str, data: Mapping[str, Any]) -> bytes:
    """What a delivery POSTs: the run as ``GET /v1/runs/{id}`` shows it when it is sent, with
    ``event`` naming what happened and what the event adds (a deadline notice's
    ``deadline_at``); fields the run has keep their meaning."""
    document = _RUN_JSON.dump_python(view, mode="json")
    return json.dumps({**document, **data, "event": event}, separators=(",", ":")).encode()


def retry_delay(attempt: int, *, base_seconds: float, max_seconds: float) -> float:
    """Seconds before the attempt after ``attempt`` (1-based): base, 2 base, 4 base, … max."""
    return float(min(max_seconds, base_seconds * 2 ** min(max(attempt - 1, 0), 62)))


def signed_headers(secret: str, msg_id: str, body: bytes, sent_at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt (signed by the library itself)."""
    signature = Webhook(secret).sign(msg_id, sent_at.astimezone(UTC), body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": signature,
    }


@dataclass(frozen=True)
class WebhookConfig:
    """Timing, concurrency, fairness and destination policy of the delivery loop."""

    timeout_seconds: float = 10.0
    lease_seconds: float = 60.0
    retry_seconds: float = 24 * 3600.0
    backoff_base_seconds: float = 5.0
    backoff_max_seconds: float = 3600.0
    concurrency: int = 8
    poll_seconds: float = 1.0
    caps: Caps = field(default_factory=Caps)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    resolver_threads: int = 16
    policy: DestinationPolicy = STRICT

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookConfig:
        """The ``RUNYARD_WEBHOOK_*`` settings."""
        return cls(
            timeout_seconds=settings.webhook_timeout_seconds,
            lease_seconds=settings.webhook_lease_seconds,
            retry_seconds=settings.webhook_retry_hours * 3600,
            backoff_base_seconds=settings.webhook_backoff_base_seconds,
            backoff_max_seconds=settings.webhook_backoff_max_seconds,
            concurrency=settings.webhook_concurrency,
            poll_seconds=settings.webhook_poll_seconds,
            caps=Caps(
                per_tenant=settings.webhook_tenant_concurrency,
                per_destination=settings.webhook_destination_concurrency,
            ),
            breaker=BreakerPolicy(
                failures=settings.webhook_breaker_failures,
                cooldown_seconds=settings.webhook_breaker_cooldown_seconds,
                cooldown_max_seconds=settings.webhook_breaker_cooldown_max_seconds,
            ),
            resolver_threads=settings.webhook_resolver_threads,
            policy=destination_policy(settings),
        )


def destination_policy(settings: Settings) -> DestinationPolicy:
    """Which non-public destinations the settings open."""
    return DestinationPolicy(
        allow_private=settings.webhook_allow_private,
        allow_loopback=settings.webhook_allow_loopback,
    )


@dataclass(frozen=True)
class Claimed:
    """A delivery this process holds the lease of."""

    id: uuid.UUID
    run_id: uuid.UUID
    tenant: str
    url: str
    attempt: int
    lease_token: uuid.UUID
    secret: str | None
    event: str = "run.completed"
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def destination(self) -> str:
        """Its ``host:port``."""
        return destination_key(self.url)


@dataclass(frozen=True)
class DeliveryPass:
    """What one ``run_once`` did."""

    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    gave_up: int = 0
    fenced: int = 0  # settled by no one: the lease was lost (or the run deleted) meanwhile
    deferred: int = 0  # held back, not attempted: their destination's breaker was open
    errors: int = 0  # attempts whose outcome could not be recorded (the lease runs out)


@dataclass(frozen=True)
class _Claim:
    claimed: list[Claimed]
    deferred: int = 0
    gave_up: int = 0


# The events that end a run: their body adds the run's usage.
FINAL_EVENTS = frozenset({"run.completed", "sandbox.ended"})
# Each tenant offers this many due deliveries beyond its cap to a claim, so offers skipped
# for a full or open destination still leave it some to send.
OFFER_SPARE = 16
# A tenant whose offers all wait for room at full destinations is looked at further, this
# many due deliveries past them, for deliveries to other destinations; at most as many such
# tenants as the claim has slots. Past that, its later deliveries wait for those destinations
# to drain: a bound, so that a claim never reads a tenant's whole backlog.
LOOK_AHEAD = 200
# How often breaker states untouched for a retry window are pruned.
PRUNE_EVERY_SECONDS = 600.0
HELD_PAST_WINDOW = (
    "not attempted again: its destination kept failing and was held back past the retry window"
)


class WebhookDeliverer:
    """Keeps up to ``concurrency`` attempts in flight, fair between tenants, and records each.

    A slot that frees is filled by the next claim at once: a receiver that never answers holds
    one slot for its timeout, never a whole batch.
    """

    def __init__(
        self,
        engine: Engine,
        config: WebhookConfig,
        *,
        owner: str | None = None,
        metrics: Metrics | None = None,
        send: Sender | None = None,
        getaddrinfo: Resolver = socket.getaddrinfo,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._engine = engine
        self._config = config
        self._owner = owner or f"{socket.gethostname()}-{os.getpid()}-webhooks"
        self._metrics = (metrics or Metrics()).export(Role.WEBHOOKS)
        self._resolver = BoundedResolver(
            threads=config.resolver_threads,
            timeout_seconds=config.timeout_seconds,
            per_key=config.caps.per_tenant,
            getaddrinfo=getaddrinfo,
        )
        self._send = send
        # The signature's timestamp is checked against the receiver's clock, so it is this
        # host's wall clock, not the database's.
        self._clock = clock
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="runyard-webhook")
        self._next_prune = 0.0

    def run_once(self, *, now: datetime | None = None) -> DeliveryPass:
        """Deliver what is due, claiming again whenever a slot frees (and every
        ``poll_seconds`` while attempts are in flight); return when nothing is in flight and
        a claim came back short."""
        totals: Counter[str] = Counter()
        in_flight: set[Future[str]] = set()
        claim_more = True
        self._enqueue_deadline_notices(now)
        while True:
            self._prune(now)
            free = self._config.concurrency - len(in_flight)
            if claim_more and free > 0 and not self._stop.is_set():
                try:
                    claim = self._claim(free, now)
                except Exception:
                    if not in_flight:
                        raise
                    logger.exception("webhook claim failed; attempts in flight go on")
                    claim = _Claim([])
                totals.update(
                    claimed=len(claim.claimed), deferred=claim.deferred, gave_up=claim.gave_up
                )
                in_flight |= {self._pool.submit(self._deliver, c, now) for c in claim.claimed}
                # A short claim: nothing more is due now, or what is due waits for its
                # tenant's or destination's attempts in flight. Claim again when one ends.
                claim_more = len(claim.claimed) == free
            if not in_flight:
                break
            done, in_flight = wait(
                in_flight, timeout=self._config.poll_seconds, return_when=FIRST_COMPLETED
            )
            for future in done:
                totals[self._outcome(future)] += 1
            claim_more = True
        return DeliveryPass(**totals)

    def run_forever(self) -> None:
        """Pass every ``poll_seconds`` until ``stop()``; errors are logged, not fatal."""
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                logger.exception("webhook delivery pass failed")
            self._stop.wait(self._config.poll_seconds)
        self._pool.shutdown(wait=True)

    def stop(self) -> None:
        """Ask ``run_forever`` to return after the attempts in progress."""
        self._stop.set()

    def close(self) -> None:
        """Release the delivery threads (for callers that only used ``run_once``)."""
        self._pool.shutdown(wait=True)

    def _outcome(self, future: Future[str]) -> str:
        try:
            return future.result()
        except Exception:
            # Sent or not, its lease runs out and it is attempted again (at least once).
            logger.exception("webhook attempt could not be recorded")
            return "errors"

    def _claim(self, slots: int, now: datetime | None) -> _Claim:
        """Offers, turns (``pick_deliveries``), held-back deliveries, then the claim."""
        config = self._config
        limit = config.caps.per_tenant + OFFER_SPARE
        rows = autocommit(self._engine, DELIVERY_OFFERS, {"per_tenant": limit, "now": now})
        offers = [
            Offer(r.id, r.tenant, destination_key(r.url), r.next_attempt_at)
            for r in rows
            if not r.in_flight
        ]
        if not offers:
            return _Claim([])
        busy = [(r.tenant, destination_key(r.url)) for r in rows if r.in_flight]
        states = self._breakers(offers)
        turns = functools.partial(
            pick_deliveries, slots=slots, caps=config.caps, policy=config.breaker, now=rows[0].now
        )
        picks = turns(offers, busy, states)
        more = self._more_offers(picks, offers, busy, limit, slots, now)
        if more:
            offers += more
            states.update(self._breakers(more))
            picks = turns(offers, busy, states)
        held = self._defer(picks, now) if picks.defer else []
        claimed = self._take(picks, offers, now) if picks.claim else []
        return _Claim(
            claimed,
            deferred=sum(1 for status in held if status == "pending"),
            gave_up=sum(1 for status in held if status == "failed"),
        )

    def _breakers(self, offers: list[Offer]) -> dict[BreakerKey, Breaker]:
        """The breaker states of the offers' tenants at their destinations (closed: none)."""
        keys = sorted({(o.tenant, o.destination) for o in offers})
        rows = autocommit(
            self._engine,
            DESTINATION_STATES,
            {"tenants": [k[0] for k in keys], "destinations": [k[1] for k in keys]},
        )
        return {(r.tenant, r.destination): Breaker(r.failures, r.open_until) for r in rows}

    def _more_offers(
        self,
        picks: Picks,
        offers: list[Offer],
        busy: list[BreakerKey],
        limit: int,
        slots: int,
        now: datetime | None,
    ) -> list[Offer]:
        """Offers further on for tenants whose offers all wait for full destinations (and
        may hold deliveries to others past them): up to ``LOOK_AHEAD`` each, for the
        ``slots`` of them with the fewest attempts in flight."""
        if len(picks.claim) >= slots or not picks.waiting:
            return []
        offered = Counter(o.tenant for o in offers)
        in_flight = Counter(tenant for tenant, _ in busy)
        # Only a tenant offered up to the limit may have more due.
        tenants = sorted(
            (t for t in picks.waiting if offered[t] >= limit), key=lambda t: (in_flight[t], t)
        )[: slots - len(picks.claim)]
        if not tenants:
            return []
        last = {t: max(o.due_at for o in offers if o.tenant == t) for t in tenants}
        rows = autocommit(
            self._engine,
            MORE_OFFERS,
            {
                "tenants": tenants,
                "after": [last[t] for t in tenants],
                "seen": [o.id for o in offers if o.tenant in last],
                "limit": LOOK_AHEAD,
                "now": now,
            },
        )
        return [Offer(r.id, r.tenant, destination_key(r.url), r.next_attempt_at) for r in rows]

    def _take(self, picks: Picks, offers: list[Offer], now: datetime | None) -> list[Claimed]:
        """Claim the picks that still fit the caps, in one short transaction: lock their
        tenants and destinations, count what every process has in flight, claim."""
        config = self._config
        by_id = {o.id: o for o in offers}
        picked = [by_id[i] for i in picks.claim]
        keys = {f"tenant:{o.tenant}" for o in picked} | {
            f"destination:{o.destination}" for o in picked
        }
        with self._engine.begin() as conn:
            conn.execute(LOCK_CLAIM, {"keys": sorted(keys)})
            in_flight = [
                (r.tenant, destination_key(r.url)) for r in conn.execute(IN_FLIGHT, {"now": now})
            ]
            admitted = admit(picked, in_flight, config.caps)
            ids = [o.id for o in admitted]
            probes = {key: i for key, i in picks.probes.items() if by_id[i] in admitted}
            rows = conn.execute(
                CLAIM_DELIVERIES,
                {
                    "ids": ids,
                    "probe_ids": list(probes.values()),
                    "probe_destinations": [destination for _, destination in probes],
                    "owner": self._owner,
                    "lease": config.lease_seconds,
                    "now": now,
                },
            ).all()
        if len(admitted) < len(picked):
            logger.info(
                "webhook claim trimmed: other processes claimed for the same tenants or "
                "destinations meanwhile",
                extra={"picked": len(picked), "admitted": len(admitted)},
            )
        return [
            Claimed(
                r.id,
                r.run_id,
                r.tenant,
                r.url,
                r.attempts,
                r.lease_token,
                r.secret,
                r.event,
                r.data or {},
            )
            for r in rows
        ]

    def _defer(self, picks: Picks, now: datetime | None) -> list[str]:
        """Hold back the deliveries of open destinations; their new statuses."""
        ids = list(picks.defer)
        rows = autocommit(
            self._engine,
            DEFER_DELIVERIES,
            {
                "ids": ids,
                "untils": [picks.defer[i] for i in ids],
                "window": self._config.retry_seconds,
                "error": HELD_PAST_WINDOW,
                "now": now,
            },
        )
        gave_up = sum(1 for r in rows if r.status == "failed")
        if rows:
            logger.info(
                "webhook deliveries held back: their destinations' breakers are open",
                extra={"deferred": len(rows) - gave_up, "gave_up": gave_up},
            )
        if gave_up:
            self._metrics.webhook_attempts.labels(outcome="gave_up").inc(gave_up)
        return [str(r.status) for r in rows]

    def _deliver(self, claimed: Claimed, now: datetime | None) -> str:
        """One attempt and its record; the outcome's name (a DeliveryPass field)."""
        view = read_run_view(self._engine, claimed.run_id, None)
        if view is None:
            return "fenced"  # the run was deleted, and its delivery with it
        attempt = self._traced_attempt(claimed, view)
        delay = retry_delay(
            claimed.attempt,
            base_seconds=self._config.backoff_base_seconds,
            max_seconds=self._config.backoff_max_seconds,
        )
        rows = autocommit(
            self._engine,
            SETTLE_DELIVERY,
            {
                "id": claimed.id,
                "token": claimed.lease_token,
                "delivered": attempt.delivered,
                "delay": delay,
                "window": self._config.retry_seconds,
                "status_code": attempt.status_code,
                "error": attempt.error,
                "now": now,
            },
        )
        extra = {
            "run_id": str(claimed.run_id),
            "attempt": claimed.attempt,
            "delivery_id": str(claimed.id),
            "destination": claimed.destination,
            "status_code": attempt.status_code,
            "error": attempt.error,
            "refused_address": attempt.refused_address,
        }
        try:
            self._record_destination(claimed.tenant, claimed.destination, attempt, now)
        except Exception:
            # The breaker only spares slots; the delivery's own record is what counts.
            logger.exception("webhook destination state not recorded", extra=extra)
        if not rows:
            logger.warning("webhook attempt not recorded: its lease was lost", extra=extra)
            return "fenced"
        outcome = {"delivered": "delivered", "failed": "gave_up"}.get(rows[0].status, "retrying")
        self._metrics.webhook_attempts.labels(outcome=outcome).inc()
        if outcome == "delivered":
            logger.info("webhook delivered", extra=extra)
        else:
            logger.warning(
                "webhook attempt failed" + ("; giving up" if outcome == "gave_up" else ""),
                extra=extra,
            )
        return outcome

    def _traced_attempt(self, claimed: Claimed, view: RunView) -> HttpAttempt:
        """The attempt, as a span of its run's trace when tracing is on."""
        traced = tracing()
        if not traced.enabled:
            return self._attempt(claimed, view)
        attributes: Attributes = {
            "runyard.run_id": str(claimed.run_id),
            "runyard.attempt": claimed.attempt,
        }
        parent = trace_of(read_run_spec(self._engine, claimed.run_id))
        with traced.span("webhook.delivery", parent=parent, attributes=attributes) as span:
            attempt = self._attempt(claimed, view)
            if attempt.status_code is not None:
                span.set("http.response.status_code", attempt.status_code)
            if not attempt.delivered:
                span.fail(attempt.error or "not delivered")
            return attempt

    def _record_destination(
        self, tenant: str, destination: str, attempt: HttpAttempt, now: datetime | None
    ) -> None:
        """Move the tenant's breaker of the destination (``after_attempt``): an answer closes
        it at once; a connection that got none is counted under the row's lock; an attempt
        that never connected changes nothing."""
        policy = self._config.breaker
        key = {"tenant": tenant, "destination": destination}
        if attempt.status_code is not None:
            autocommit(self._engine, CLOSE_DESTINATION, key)
            return
        if not attempt.unanswered:
            return  # it never connected: the tenant's own failure, not the destination's
        with self._engine.begin() as conn:
            row = conn.execute(LOCK_DESTINATION, {**key, "now": now}).one()
            before = Breaker(row.failures, row.open_until)
            after = after_attempt(before, answered=False, now=row.now, policy=policy)
            conn.execute(
                SAVE_DESTINATION,
                {
                    **key,
                    "failures": after.failures,
                    "open_until": after.open_until,
                    "now": now,
                },
            )
        if after.open_until is not None and before.failures < policy.failures:
            logger.warning(
                "webhook destination failing: the tenant's deliveries there are held back",
                extra={
                    "tenant": tenant,
                    "destination": destination,
                    "failures": after.failures,
                    "open_until": after.open_until.isoformat(),
                },
            )

    def _enqueue_deadline_notices(self, now: datetime | None) -> None:
        """Write the deadline notices now due (each once, whichever process writes it)."""
        try:
            written = autocommit(self._engine, ENQUEUE_DEADLINE_NOTICES, {"now": now})
        except Exception:
            logger.exception("writing deadline notices failed; tried again next pass")
            return
        if written:
            logger.info("deadline notices written", extra={"notices": len(written)})

    def _prune(self, now: datetime | None) -> None:
        """Forget breaker states untouched for a retry window, every ``PRUNE_EVERY_SECONDS``."""
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + PRUNE_EVERY_SECONDS
        try:
            autocommit(
                self._engine, PRUNE_DESTINATIONS, {"age": self._config.retry_seconds, "now": now}
            )
        except Exception:
            logger.exception("pruning webhook destination states failed; tried again later")

    def _attempt(self, claimed: Claimed, view: RunView) -> HttpAttempt:
        """The attempt (one that could not be sent never connected: it says nothing of its
        destination)."""
        if not claimed.secret:
            return HttpAttempt(error="the tenant has no webhook secret to sign with")
        try:
            url: CallbackUrl = parse_callback_url(claimed.url)
        except BadCallbackUrl as exc:
            return HttpAttempt(error=f"bad URL: {exc}")
        data = dict(claimed.data)
        if claimed.event in FINAL_EVENTS:
            # The run's last word carries what it consumed (null: nothing was metered).
            data["usage"] = UsageLedger(self._engine).of_run(claimed.run_id)
        body = delivery_body(view, claimed.event, data)
        headers: Mapping[str, Any] = {
            "Content-Type": "application/json",
            "User-Agent": f"runyard/{runyard.__version__}",
            "Runyard-Event": claimed.event,
            **signed_headers(claimed.secret, str(claimed.id), body, self._clock()),
        }
        # Name lookups count against the tenant's share of the resolver.
        send = self._send or functools.partial(post, resolve=self._resolver.for_key(claimed.tenant))
        return send(
            url, body, headers, timeout=self._config.timeout_seconds, policy=self._config.policy
        )
