"""A tenant's webhook settings: its default URL and the secret that signs its deliveries."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine

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


@dataclass(frozen=True)
class Configured:
    """The settings after a change; ``secret`` only when a new one was made (shown once)."""

    tenant: str
    url: str | None
    secret: str | None


class TenantWebhooks:
    """Reads and writes ``tenant_settings``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def configure(self, tenant: str, url: str | None, *, rotate_secret: bool = False) -> Configured:
        """Set the default URL (None: no default); make a secret if none or if asked."""
        candidate = new_secret()
        with self._engine.begin() as conn:
            row = conn.execute(
                CONFIGURE_TENANT,
                {
                    "tenant": tenant,
                    "url": url,
                    "secret": candidate,
                    "rotate": rotate_secret,
                    "now": None,
                },
            ).one()
        return Configured(tenant, row.webhook_url, candidate if row.secret_stored else None)

    def get(self, tenant: str) -> TenantWebhook:
        """The tenant's settings (no row: no URL, no secret)."""
        rows = autocommit(self._engine, TENANT_WEBHOOK, {"tenant": tenant, "now": None})
        if not rows:
            return TenantWebhook(tenant, None, False)
        row = rows[0]
        return TenantWebhook(tenant, row.webhook_url, bool(row.has_secret), row.updated_at)
