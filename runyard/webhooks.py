"""Completion webhooks: deliver the outbox that a trigger fills when runs become terminal.

Each delivery is POSTed with the run as ``GET /v1/runs/{id}`` shows it, signed the Standard
Webhooks way (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``: HMAC-SHA256 with
the tenant's secret), at least once: rows are claimed with FOR UPDATE SKIP LOCKED under a
lease, so several delivering processes share the work, and one that dies leaves its
deliveries due again when their lease runs out. A failed attempt (an error, a timeout, or
any status but 2xx, a redirect included) is retried after a doubling backoff until the
retry window after the run's end has passed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic
from sqlalchemy import Engine
from standardwebhooks.webhooks import Webhook

import runyard
from runyard.db import autocommit
from runyard.metrics import Metrics
from runyard.runs import RunReader, RunView
from runyard.settings import Settings
from runyard.webhook_http import HttpAttempt, post
from runyard.webhook_sql import CLAIM_DELIVERIES, SETTLE_DELIVERY
from runyard.webhook_urls import BadCallbackUrl, CallbackUrl, parse_callback_url

logger = logging.getLogger(__name__)

# The API's serializer of a run, without the API: the same fields and types give the same JSON.
_RUN_JSON: pydantic.TypeAdapter[RunView] = pydantic.TypeAdapter(RunView)

Sender = Callable[..., HttpAttempt]


def run_json(view: RunView) -> bytes:
    """The run as ``GET /v1/runs/{id}`` shows it, as JSON bytes."""
    return _RUN_JSON.dump_json(view)


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
    """Timing, concurrency and destination policy of the delivery loop."""

    timeout_seconds: float = 10.0
    lease_seconds: float = 60.0
    retry_seconds: float = 24 * 3600.0
    backoff_base_seconds: float = 5.0
    backoff_max_seconds: float = 3600.0
    concurrency: int = 8
    poll_seconds: float = 1.0
    allow_private: bool = False

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
            allow_private=settings.webhook_allow_private,
        )


@dataclass(frozen=True)
class Claimed:
    """A delivery this process holds the lease of."""

    id: uuid.UUID
    run_id: uuid.UUID
    url: str
    attempt: int
    lease_token: uuid.UUID
    secret: str | None


@dataclass(frozen=True)
class DeliveryPass:
    """What one ``run_once`` did."""

    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    gave_up: int = 0
    fenced: int = 0  # settled by no one: the lease was lost (or the run deleted) meanwhile


class WebhookDeliverer:
    """Claims due deliveries, sends them ``concurrency`` at a time, records every attempt."""

    def __init__(
        self,
        engine: Engine,
        config: WebhookConfig,
        *,
        owner: str | None = None,
        metrics: Metrics | None = None,
        send: Sender = post,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._engine = engine
        self._config = config
        self._owner = owner or f"{socket.gethostname()}-{os.getpid()}-webhooks"
        self._metrics = metrics or Metrics()
        self._send = send
        # The signature's timestamp is checked against the receiver's clock, so it is this
        # host's wall clock, not the database's.
        self._clock = clock
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="runyard-webhook")

    def run_once(self, *, now: datetime | None = None) -> DeliveryPass:
        """Deliver what is due, batch after batch, until a batch comes back short."""
        totals: dict[str, int] = {}
        while not self._stop.is_set():
            batch = self._claim(now)
            totals["claimed"] = totals.get("claimed", 0) + len(batch)
            for outcome in self._pool.map(lambda c: self._deliver(c, now), batch):
                totals[outcome] = totals.get(outcome, 0) + 1
            if len(batch) < self._config.concurrency:
                break
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

    def _claim(self, now: datetime | None) -> list[Claimed]:
        rows = autocommit(
            self._engine,
            CLAIM_DELIVERIES,
            {
                "batch": self._config.concurrency,
                "owner": self._owner,
                "lease": self._config.lease_seconds,
                "now": now,
            },
        )
        return [Claimed(r.id, r.run_id, r.url, r.attempts, r.lease_token, r.secret) for r in rows]

    def _deliver(self, claimed: Claimed, now: datetime | None) -> str:
        """One attempt and its record; the outcome's name (a DeliveryPass field)."""
        view = RunReader(self._engine).view(claimed.run_id, None)
        if view is None:
            return "fenced"  # the run was deleted, and its delivery with it
        attempt = self._attempt(claimed, view)
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
            "status_code": attempt.status_code,
            "error": attempt.error,
        }
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

    def _attempt(self, claimed: Claimed, view: RunView) -> HttpAttempt:
        if not claimed.secret:
            return HttpAttempt(error="the tenant has no webhook secret to sign with")
        try:
            url: CallbackUrl = parse_callback_url(claimed.url)
        except BadCallbackUrl as exc:
            return HttpAttempt(error=f"bad URL: {exc}")
        body = run_json(view)
        headers: Mapping[str, Any] = {
            "Content-Type": "application/json",
            "User-Agent": f"runyard/{runyard.__version__}",
            **signed_headers(claimed.secret, str(claimed.id), body, self._clock()),
        }
        return self._send(
            url,
            body,
            headers,
            timeout=self._config.timeout_seconds,
            allow_private=self._config.allow_private,
        )
