"""What the dashboard's handlers depend on: its templates and signer, and the session."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import Services, ServicesDep
from api.ui.session import COOKIE_NAME, Session, SessionSigner, load_session, same_token

logger = logging.getLogger(__name__)

UI_PREFIX = "/ui"
STATIC_PREFIX = UI_PREFIX + "/static/"
# Nothing on a page may load or send anything anywhere but this origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


@dataclass(frozen=True)
class UiContext:
    """Built once by ``api.ui.install.install_ui``."""

    templates: Jinja2Templates
    signer: SessionSigner
    auth_disabled: bool
    cookie_secure: bool
    # With auth disabled everyone is this session (its CSRF token still guards the forms).
    dev_session: Session


class UiError(Exception):
    """An error shown as a dashboard page (not a problem document)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


class LoginRequired(Exception):
    """No valid session: pages go to the login form, fragments and streams answer 401."""


def get_ui(request: Request) -> UiContext:
    """The dashboard's context of the running app."""
    ui: UiContext = request.app.state.ui
    return ui


UiDep = Annotated[UiContext, Depends(get_ui)]


async def session_of(services: Services, ui: UiContext, cookies: Mapping[str, str]) -> Session:
    """The session of a request's cookies (the ``dev`` admin with auth disabled), or
    ``LoginRequired``."""
    if ui.auth_disabled:
        return ui.dev_session
    found = await run_in_threadpool(
        load_session, services.engine, ui.signer, cookies.get(COOKIE_NAME)
    )
    if found is None:
        raise LoginRequired()
    return found


async def get_session(request: Request, services: ServicesDep, ui: UiDep) -> Session:
    """The caller's session from its cookie; with auth disabled, the ``dev`` admin."""
    session = await session_of(services, ui, request.cookies)
    request.state.ui_session = session
    return session


SessionDep = Annotated[Session, Depends(get_session)]


def check_same_origin(request: Request) -> None:
    """Refuse a form post another site's page made (login CSRF included): browsers send
    ``Sec-Fetch-Site`` and ``Origin`` with every POST; tools that send neither pass."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise UiError(403, "Refused", "This form was sent from another site.")
    origin = request.headers.get("origin")
    # Host only: behind a TLS-terminating proxy the page is https and the app sees http.
    if origin is not None and urlsplit(origin).netloc != request.url.netloc:
        raise UiError(403, "Refused", "This form was sent from another site.")


def check_csrf(session: Session, fields: dict[str, str]) -> None:
    """A form post must carry the session's token (SameSite=Strict is the first guard)."""
    if not same_token(fields.get("csrf_token"), session.csrf_token):
        raise UiError(
            403, "Form expired", "The form is stale or came from another site. Reload the page."
        )


def login_required_response(request: Request, exc: Exception) -> Response:
    fragment = request.headers.get("x-runyard-fragment") is not None
    if fragment or "text/event-stream" in request.headers.get("accept", ""):
        return PlainTextResponse("log in again", status_code=401)
    if request.method == "GET":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    else:
        # A form posted after the session ended: log in, then back to the page it came from.
        referer = urlsplit(request.headers.get("referer", ""))
        same = referer.netloc == request.url.netloc and referer.path.startswith(UI_PREFIX + "/")
        target = referer.path if same else f"{UI_PREFIX}/runs"
    return RedirectResponse(f"/ui/login?next={quote(target)}", status_code=303)


def ui_error_response(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, UiError)
    ui = get_ui(request)
    return ui.templates.TemplateResponse(
        request,
        "error.html",
        {
            "session": getattr(request.state, "ui_session", None),
            "auth_disabled": ui.auth_disabled,
            "notice": None,
            "title": exc.title,
            "message": exc.message,
        },
        status_code=exc.status,
    )


class UiSecurityHeaders:
    """Adds the dashboard's security headers to every answer under ``/ui``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not (path == UI_PREFIX or path.startswith(UI_PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        extra = SECURITY_HEADERS
        if not path.startswith(STATIC_PREFIX):
            # Pages hold tenant data and CSRF tokens: not for the back button after logout.
            extra = [*SECURITY_HEADERS, (b"cache-control", b"no-store")]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)
