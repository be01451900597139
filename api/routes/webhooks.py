"""A tenant's webhook settings (admins)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from api.actions.webhooks import check_callback_url
from api.deps import PrincipalDep, ServicesDep
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from runyard.domain.webhook_events import MAX_DEADLINE_LEAD_SECONDS, WebhookEvent
from runyard.tenancy.auth import Principal
from runyard.webhooks.tenant import TenantWebhooks
from runyard.webhooks.urls import MAX_URL_LENGTH

router = APIRouter(prefix="/v1/tenants", tags=["webhooks"], responses=COMMON_ERRORS)

TenantPath = Annotated[str, Path(min_length=1, max_length=128, description="The tenant's name")]
ADMIN_ONLY = problem("The API key is not an admin key")


class WebhookSettingsIn(BaseModel):
    """A tenant's default webhook URL; unknown fields are refused."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        # No {"url": null} example: the document drops nulls, and {} would not validate.
        json_schema_extra={
            "examples": [
                {"url": "https://hooks.acme.example/runyard"},
                {"url": "https://hooks.acme.example/runyard", "rotate_secret": True},
                {
                    "url": "https://hooks.acme.example/runyard",
                    "events": ["run.started", "run.deadline_approaching", "run.completed"],
                    "deadline_lead_seconds": 120,
                },
            ]
        },
    )

    url: str | None = Field(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="Where the tenant's runs without a callback_url report (null: nowhere)",
    )
    rotate_secret: bool = Field(
        default=False, description="Make a new signing secret even if the tenant has one"
    )
    events: list[WebhookEvent] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description="The events the tenant's URL and its runs' callback URLs receive "
        "(omitted: keep them; a new tenant takes run.completed alone)",
    )
    deadline_lead_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DEADLINE_LEAD_SECONDS,
        description="How long before an attempt's deadline run.deadline_approaching is sent "
        "(omitted: keep it; 60 for a new tenant)",
    )


class WebhookSettingsOut(BaseModel):
    """A tenant's webhook settings; ``secret`` only in the answer that made it (once)."""

    tenant: str
    url: str | None
    has_secret: bool
    events: list[str] = Field(description="The events it receives, in the order they go out")
    deadline_lead_seconds: int
    secret: str | None = Field(
        default=None, description="The new signing secret (whsec_…): shown this once only"
    )


def _admin(principal: Principal) -> None:
    if not principal.admin:
        raise Problem(403, "forbidden", "managing tenants' webhooks needs an admin key")


@router.get("/{tenant}/webhook", operation_id="getTenantWebhook", responses={403: ADMIN_ONLY})
def get_webhook(
    tenant: TenantPath, services: ServicesDep, principal: PrincipalDep
) -> WebhookSettingsOut:
    """The tenant's default webhook URL and whether it has a secret (never the secret)."""
    _admin(principal)
    found = TenantWebhooks(services.engine).get(tenant)
    return WebhookSettingsOut(
        tenant=tenant,
        url=found.url,
        has_secret=found.has_secret,
        events=list(found.events),
        deadline_lead_seconds=found.deadline_lead_seconds,
    )


@router.put(
    "/{tenant}/webhook",
    operation_id="setTenantWebhook",
    responses={403: ADMIN_ONLY, **BODY_ERRORS},
)
def put_webhook(
    tenant: TenantPath,
    body: WebhookSettingsIn,
    services: ServicesDep,
    principal: PrincipalDep,
) -> WebhookSettingsOut:
    """Set the tenant's default webhook URL and the events it takes; the first call (or
    ``rotate_secret``) makes the signing secret and returns it, this once."""
    _admin(principal)
    if body.url is not None:
        check_callback_url(services.settings, body.url, field="url")
    configured = TenantWebhooks(services.engine).configure(
        tenant,
        body.url,
        rotate_secret=body.rotate_secret,
        events=None if body.events is None else tuple(body.events),
        deadline_lead_seconds=body.deadline_lead_seconds,
    )
    return WebhookSettingsOut(
        tenant=tenant,
        url=configured.url,
        has_secret=True,
        secret=configured.secret,
        events=list(configured.events),
        deadline_lead_seconds=configured.deadline_lead_seconds,
    )
