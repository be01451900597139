"""A tenant's webhook settings (admins), and the checks of callback URLs at submit."""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from api.deps import PrincipalDep, Services, ServicesDep
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from runyard.platform.settings import Settings
from runyard.tenancy.auth import Principal
from runyard.webhooks.delivery import destination_policy
from runyard.webhooks.tenant import TenantWebhooks
from runyard.webhooks.urls import (
    MAX_URL_LENGTH,
    BadCallbackUrl,
    DestinationRefused,
    check_destination,
)

router = APIRouter(prefix="/v1/tenants", tags=["webhooks"], responses=COMMON_ERRORS)

TenantPath = Annotated[str, Path(min_length=1, max_length=128, description="The tenant's name")]
ADMIN_ONLY = problem("The API key is not an admin key")


class WebhookSettingsIn(BaseModel):
    """A tenant's default webhook URL; unknown fields are refused."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"url": None}, {"url": None, "rotate_secret": True}]},
    )

    url: str | None = Field(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="Where the tenant's runs without a callback_url report (null: nowhere)",
    )
    rotate_secret: bool = Field(
        default=False, description="Make a new signing secret even if the tenant has one"
    )


class WebhookSettingsOut(BaseModel):
    """A tenant's webhook settings; ``secret`` only in the answer that made it (once)."""

    tenant: str
    url: str | None
    has_secret: bool
    secret: str | None = Field(
        default=None, description="The new signing secret (whsec_…): shown this once only"
    )


def _admin(principal: Principal) -> None:
    if not principal.admin:
        raise Problem(403, "forbidden", "managing tenants' webhooks needs an admin key")


def check_callback_url(settings: Settings, url: str, field: str) -> None:
    """A 422 unless ``url`` is a webhook URL whose destination may be sent to, as far as can
    be told without DNS (an address in it, a loopback name); names are checked at every
    delivery. No I/O: safe on the event loop."""
    try:
        check_destination(url, destination_policy(settings))
    except BadCallbackUrl as exc:
        raise Problem(422, "invalid_callback_url", f"{field}: {exc}", field=field) from exc
    except DestinationRefused as exc:
        raise Problem(
            422,
            "callback_url_refused",
            f"{field}: {exc}; webhooks may only reach public addresses",
            field=field,
        ) from exc


def check_callback_urls(settings: Settings, urls: Collection[str], field: str) -> None:
    """``check_callback_url`` for each of a batch's distinct URLs, at most
    ``RUNYARD_WEBHOOK_BATCH_MAX_URLS`` of them (a 422 beyond)."""
    cap = settings.webhook_batch_max_urls
    if len(urls) > cap:
        raise Problem(
            422,
            "too_many_callback_urls",
            f"the batch names {len(urls)} different callback URLs; at most {cap} are "
            "allowed (RUNYARD_WEBHOOK_BATCH_MAX_URLS): give the batch one callback_url, or "
            "fewer distinct ones",
            field=field,
        )
    for url in sorted(urls):
        check_callback_url(settings, url, field)


def require_webhook_secret(services: Services, tenant: str, field: str) -> None:
    """A 422 unless the tenant has a secret to sign its runs' callbacks with (reads the
    database: call it off the event loop)."""
    if not TenantWebhooks(services.engine).get(tenant).has_secret:
        raise Problem(
            422,
            "webhook_secret_missing",
            f"tenant {tenant!r} has no webhook secret to sign with yet; an admin makes one "
            f"with PUT /v1/tenants/{tenant}/webhook",
            field=field,
        )


@router.get("/{tenant}/webhook", responses={403: ADMIN_ONLY})
def get_webhook(
    tenant: TenantPath, services: ServicesDep, principal: PrincipalDep
) -> WebhookSettingsOut:
    """The tenant's default webhook URL and whether it has a secret (never the secret)."""
    _admin(principal)
    found = TenantWebhooks(services.engine).get(tenant)
    return WebhookSettingsOut(tenant=tenant, url=found.url, has_secret=found.has_secret)


@router.put("/{tenant}/webhook", responses={403: ADMIN_ONLY, **BODY_ERRORS})
def put_webhook(
    tenant: TenantPath,
    body: WebhookSettingsIn,
    services: ServicesDep,
    principal: PrincipalDep,
) -> WebhookSettingsOut:
    """Set the tenant's default webhook URL; the first call (or ``rotate_secret``) makes the
    signing secret and returns it, this once."""
    _admin(principal)
    if body.url is not None:
        check_callback_url(services.settings, body.url, field="url")
    configured = TenantWebhooks(services.engine).configure(
        tenant, body.url, rotate_secret=body.rotate_secret
    )
    return WebhookSettingsOut(
        tenant=tenant, url=configured.url, has_secret=True, secret=configured.secret
    )
