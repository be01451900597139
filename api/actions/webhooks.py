"""The checks of callback URLs at submit (a run, a batch, a tenant's default)."""

from __future__ import annotations

from collections.abc import Collection

from api.deps import Services
from api.problems import Problem
from runyard.platform.settings import Settings
from runyard.webhooks.delivery import destination_policy
from runyard.webhooks.tenant import TenantWebhooks
from runyard.webhooks.urls import BadCallbackUrl, DestinationRefused, check_destination


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
