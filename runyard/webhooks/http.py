"""One webhook POST: resolve, check every address, connect to a checked one, never follow a
redirect, and give up when the whole attempt has taken its timeout."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from runyard.webhooks.urls import (
    STRICT,
    CallbackUrl,
    DestinationPolicy,
    DestinationRefused,
    Resolver,
    checked_addresses,
)

ERROR_CHARS = 300


@dataclass(frozen=True)
class HttpAttempt:
    """What one attempt got: a status code, or an error (never both)."""

    status_code: int | None = None
    error: str | None = None
    # The address a destination was refused for: for operators' logs, never for the tenant.
    refused_address: str | None = None
    # Whether a connection to a checked address was tried. An attempt that failed before (a
    # name that did not resolve in time, a refused address, no lookup to spare) says nothing
    # of the destination: only one that tried and got no answer counts against it.
    connected: bool = False

    @property
    def unanswered(self) -> bool:
        """A connection was tried and no HTTP answer came: the destination's failure."""
        return self.connected and self.status_code is None

    @property
    def delivered(self) -> bool:
        """Only a 2xx counts; a 3xx is a failed attempt (redirects are not followed)."""
        return self.status_code is not None and 200 <= self.status_code < 300


class _Watchdog:
    """Shuts a socket down at a deadline, so a peer that trickles bytes cannot hold an
    attempt past its timeout (socket timeouts bound each read, not the sum of them)."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self.fired = False
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


class _NoTimeLeft(TimeoutError):
    """The lookup took the whole timeout: no connection was tried."""


def _connect(url: CallbackUrl, addresses: list[str], deadline: float) -> socket.socket:
    """A connection to the first of the checked addresses that answers (TLS if https)."""
    error: OSError | None = None
    for address in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            sock = socket.create_connection((address, url.port), timeout=remaining)
        except OSError as exc:
            error = exc
            continue
        if not url.tls:
            return sock
        try:
            context = ssl.create_default_context()
            # The certificate is checked against the name in the URL, not the address.
            return context.wrap_socket(sock, server_hostname=url.host)
        except (OSError, ssl.SSLError):
            sock.close()
            raise
    if error is None:
        raise _NoTimeLeft("timed out")
    raise error


def post(
    url: CallbackUrl,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout: float,
    policy: DestinationPolicy = STRICT,
    resolve: Resolver = socket.getaddrinfo,
) -> HttpAttempt:
    """POST ``body`` to ``url``; the outcome, never an exception. Resolving counts in the
    timeout (``resolve`` should be a ``BoundedResolver`` that gives up by then)."""
    deadline = time.monotonic() + timeout
    try:
        addresses = checked_addresses(url.host, url.port, policy, resolve)
    except DestinationRefused as exc:
        return HttpAttempt(error=f"refused: {exc}"[:ERROR_CHARS], refused_address=exc.address)
    try:
        sock = _connect(url, [str(a) for a in addresses], deadline)
    except _NoTimeLeft as exc:
        return HttpAttempt(error=_describe(exc, timeout))
    except (OSError, ssl.SSLError) as exc:
        return HttpAttempt(error=_describe(exc, timeout), connected=True)
    conn = http.client.HTTPConnection(url.host, url.port, timeout=timeout)
    conn.sock = sock  # already connected to the checked address: http.client will not resolve
    with _Watchdog(sock, deadline - time.monotonic()) as watchdog:
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            conn.request("POST", url.target, body=body, headers={"Host": url.netloc, **headers})
            response = conn.getresponse()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            if watchdog.fired:
                return HttpAttempt(error=f"timed out after {timeout:g} s", connected=True)
            return HttpAttempt(error=_describe(exc, timeout), connected=True)
        finally:
            conn.close()
    return HttpAttempt(status_code=status, connected=True)


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out after {timeout:g} s"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:ERROR_CHARS]
