"""A pure ASGI middleware that gives each request a server span when tracing is on, a child
of the caller's W3C ``traceparent`` if it sent a valid one; nothing at all when it is off."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from api.http_metrics import UNCOUNTED_PATHS, StatusOf, method_label, route_label
from runyard.platform.tracing import parse_context, tracing


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class TraceRequests:
    """``{method} {route template}`` spans with the response's status code."""

    def __init__(self, app: ASGIApp, untraced: frozenset[str] = UNCOUNTED_PATHS) -> None:
        self.app = app
        self._untraced = untraced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        traced = tracing()
        if not traced.enabled or scope["type"] != "http" or scope["path"] in self._untraced:
            await self.app(scope, receive, send)
            return
        parent = parse_context(_header(scope, b"traceparent"), _header(scope, b"tracestate"))
        method = method_label(scope["method"])
        with traced.span(f"HTTP {method}", parent=parent, server=True) as span:
            sent = StatusOf(send)
            try:
                await self.app(scope, receive, sent)
            finally:
                status = sent.status
                route = route_label(scope)
                span.rename(f"{method} {route}")
                span.set("http.request.method", method)
                span.set("http.route", route)
                span.set("http.response.status_code", status)
                if status >= 500:
                    span.fail(f"answered {status}")
