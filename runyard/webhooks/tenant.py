"""A tenant's webhook settings: its default URL, the secret that signs its deliveries, the
events it takes and how early a deadline notice goes."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine

from runyard.domain.webhook_events import (
    DEFAULT_DEADLINE_LEAD_SECONDS,
    DEFAULT_EVENTS,
    WebhookEvent,
)
from runyard.platform.db import autocommit
from runyard.webhooks.sql import CONFIGURE_TENANT, TENANT_WEBHOOK

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    """A random signing secret in the Standard Webhooks form (``whsec_`` + base64)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


@dataclass(frozen=True)
class TenantWebhook:
    """What a tenant's webhook settings show: never the secret itself."""

    tenant: str
    url: str | None
    has_secret: bool
    updated_at: datetime | None = None
    events: tuple[str, ...] = DEFAULT_EVENTS
    deadline_lead_seconds: int = DEFAULT_DEADLINE_LEAD_SECONDS


@dataclass(frozen=True)
class Configured:
    """The settings after a change; ``secret`` only when a new one was made (shown once)."""

    tenant: str
    url: str | None
    secret: str | None
    events: tuple[str, ...] = DEFAULT_EVENTS
    deadline_lead_seconds: int = DEFAULT_DEADLINE_LEAD_SECONDS


class TenantWebhooks:
    """Reads and writes ``tenant_settings``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def configure(
        self,
        tenant: str,
        url: str | None,
        *,
        rotate_secret: bool = False,
        events: tuple[WebhookEvent, ...] | None = None,
        deadline_lead_seconds: int | None = None,
    ) -> Configured:
        """Set the default URL (None: no default); make a secret if none or if asked; set the
        events and the deadline lead when given (None: keep them)."""
        candidate = new_secret()
        with self._engine.begin() as conn:
            row = conn.execute(
                CONFIGURE_TENANT,
                {
                    "tenant": tenant,
                    "url": url,
                    "secret": candidate,
                    "rotate": rotate_secret,
                    "events": None if events is None else list(dict.fromkeys(events)),
                    "lead": deadline_lead_seconds,
                    "now": None,
                },
            ).one()
        return Configured(
            tenant,
            row.webhook_url,
            candidate if row.secret_stored else None,
            tuple(row.webhook_events),
            row.deadline_lead_seconds,
        )

    def get(self, tenant: str) -> TenantWebhook:
        """The tenant's settings (no row: no URL, no secret)."""
        rows = autocommit(self._engine, TENANT_WEBHOOK, {"tenant": tenant, "now": None})
        if not rows:
            return TenantWebhook(tenant, None, False)
        row = rows[0]
        return TenantWebhook(
            tenant,
            row.webhook_url,
            bool(row.has_secret),
            row.updated_at,
            tuple(row.webhook_events),
            row.deadline_lead_seconds,
        )
