"""Mounting the dashboard on the API app: the one module that knows every part of it."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api.deps import DEV_TENANT
from api.ui import (
    artifact_views,
    build_views,
    run_list,
    sandbox_views,
    schedule_views,
    submit_views,
)
from api.ui.batch_views import router as batch_router
from api.ui.context import (
    STATIC_PREFIX,
    LoginRequired,
    UiContext,
    UiError,
    UiSecurityHeaders,
    login_required_response,
    ui_error_response,
)
from api.ui.render import STATIC_DIR, make_templates
from api.ui.session import Session, SessionSigner
from api.ui.views import router
from runyard.platform.settings import Settings
from runyard.tenancy.auth import Principal

logger = logging.getLogger(__name__)


def install_ui(app: FastAPI, settings: Settings) -> None:
    """Mount the dashboard (pages, static assets, headers) on the API app."""
    if settings.ui_session_secret is not None:
        secret = settings.ui_session_secret.get_secret_value().encode()
    else:
        secret = secrets.token_bytes(32)
        if not settings.auth_disabled:
            logger.warning(
                "RUNYARD_UI_SESSION_SECRET is not set: dashboard sessions end when this "
                "process restarts and are not shared between API replicas"
            )
    app.state.ui = UiContext(
        templates=make_templates(),
        signer=SessionSigner(secret, lifetime_seconds=settings.ui_session_hours * 3600),
        auth_disabled=settings.auth_disabled,
        cookie_secure=settings.ui_cookie_secure,
        dev_session=Session(
            principal=Principal(tenant=DEV_TENANT, admin=True),
            key_prefix="",
            # From the secret, so every replica sharing it accepts the same forms.
            csrf_token=hmac.new(secret, b"runyard-dev-csrf", hashlib.sha256).hexdigest(),
        ),
    )
    app.add_exception_handler(LoginRequired, login_required_response)
    app.add_exception_handler(UiError, ui_error_response)
    app.mount(STATIC_PREFIX.rstrip("/"), StaticFiles(directory=STATIC_DIR), name="ui-static")
    # The runs list first: its /ui/runs/rows and /ui/runs/bulk are not run ids.
    app.include_router(run_list.router)
    app.include_router(router)
    app.include_router(submit_views.router)
    app.include_router(artifact_views.router)
    app.include_router(build_views.router)
    app.include_router(sandbox_views.router)
    app.include_router(batch_router)
    app.include_router(schedule_views.router)
    app.add_middleware(UiSecurityHeaders)
