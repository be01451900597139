"""A pure ASGI middleware that counts and times HTTP requests by route template.

The route label is the matched route's template (``/v1/runs/{run_id}``), never the raw path,
so ids cannot multiply the series; a request no route matched is ``unmatched``. Probes and
scrapes (``/healthz``, ``/readyz``, ``/metrics``) pass straight through, untouched.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runyard.reads.metrics import Metrics

UNCOUNTED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"


def route_label(scope: Scope) -> str:
    """The template of the route that served the request, or ``unmatched``."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


def method_label(method: str) -> str:
    """The method, or ``other`` for one outside the usual few (a client picks it freely)."""
    return method if method in KNOWN_METHODS else "other"


class StatusOf:
    """``send`` that remembers the response's status: a request that ends without a
    response start is a server error (the error middleware outside answers 500)."""

    def __init__(self, send: Send) -> None:
        self.status = 500
        self._send = send

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        await self._send(message)


class RequestMetrics:
    """Counts every answered request by method, route template and status code, and times
    it from receipt until its last body byte is sent (an event stream: while it is open)."""

    def __init__(
        self, app: ASGIApp, metrics: Metrics, uncounted: frozenset[str] = UNCOUNTED_PATHS
    ) -> None:
        self.app = app
        self._metrics = metrics
        self._uncounted = uncounted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._uncounted:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent = StatusOf(send)
        try:
            await self.app(scope, receive, sent)
        finally:
            method = method_label(scope["method"])
            route = route_label(scope)
            status = sent.status
            self._metrics.http_requests.labels(method=method, route=route, status=str(status)).inc()
            self._metrics.http_duration.labels(method=method, route=route).observe(
                time.perf_counter() - started
            )
