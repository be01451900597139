"""The events a webhook reports, in the order one run's deliveries go out (a sandbox is a run
whose end is ``sandbox.ended``)."""

from __future__ import annotations

from typing import Literal, get_args

WebhookEvent = Literal["run.started", "run.deadline_approaching", "run.completed", "sandbox.ended"]

WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = get_args(WebhookEvent)
# What a tenant receives until it chooses: completion alone, as before lifecycle events.
DEFAULT_EVENTS: tuple[WebhookEvent, ...] = ("run.completed",)
DEFAULT_DEADLINE_LEAD_SECONDS = 60
MAX_DEADLINE_LEAD_SECONDS = 7 * 24 * 3600
