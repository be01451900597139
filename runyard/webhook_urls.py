"""Webhook destinations: which URLs are accepted, and which addresses may be connected to.

A webhook makes runyard send a request to a place a tenant names. Left open, that lets a
tenant reach what only the platform can (the database, a cloud metadata service, an admin
port on loopback): server-side request forgery. So a destination must resolve to public
addresses only, checked when the URL is given and again at every delivery (DNS can change),
and the delivery connects to the very address that was checked.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048
SCHEMES = {"http": 80, "https": 443}

Resolver = Callable[..., Sequence[tuple[Any, ...]]]
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class BadCallbackUrl(ValueError):
    """The URL is not one a webhook can be sent to."""


class DestinationRefused(Exception):
    """The destination resolves to an address webhooks may not reach (or does not resolve)."""


@dataclass(frozen=True)
class CallbackUrl:
    """A parsed webhook URL: where to connect, and what to ask for."""

    url: str
    scheme: str
    host: str  # lowercase, no brackets around an IPv6 literal
    port: int
    netloc: str  # the Host header: host[:port] as written, without credentials
    target: str  # path and query

    @property
    def tls(self) -> bool:
        """Whether to speak TLS."""
        return self.scheme == "https"


def parse_callback_url(url: str) -> CallbackUrl:
    """Check and split a webhook URL: http or https, a host, no credentials, a length cap."""
    if len(url) > MAX_URL_LENGTH:
        raise BadCallbackUrl(f"the URL is longer than {MAX_URL_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise BadCallbackUrl("the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadCallbackUrl(f"the URL is malformed: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise BadCallbackUrl("the URL must start with http:// or https://")
    if not parts.hostname:
        raise BadCallbackUrl("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise BadCallbackUrl("credentials in the URL are not supported (deliveries are signed)")
    if port == 0:
        raise BadCallbackUrl("the URL's port must be 1 to 65535")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return CallbackUrl(
        url=url,
        scheme=scheme,
        host=parts.hostname,
        port=port or SCHEMES[scheme],
        netloc=parts.netloc,
        target=target,
    )


def refusal(address: IpAddress, *, allow_private: bool) -> str | None:
    """Why webhooks may not reach ``address`` (None: they may).

    Only globally routable unicast addresses are allowed; ``allow_private`` also allows
    loopback, private, link-local and other non-global ranges, never multicast or unspecified.
    """
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    if address.is_unspecified or address.is_multicast:
        return f"{address} is an unspecified or multicast address"
    if address.is_global or allow_private:
        return None
    if address.is_loopback:
        kind = "a loopback"
    elif address.is_link_local:
        kind = "a link-local"
    elif address.is_private:
        kind = "a private"
    else:
        kind = "a non-public"
    return f"{address} is {kind} address (RUNYARD_WEBHOOK_ALLOW_PRIVATE allows it)"


def checked_addresses(
    host: str, port: int, *, allow_private: bool, resolve: Resolver = socket.getaddrinfo
) -> list[IpAddress]:
    """Every address ``host`` resolves to, all of them allowed; else ``DestinationRefused``.

    One refused address refuses the host: a name that resolves to a public and a private
    address could otherwise be steered to the private one.
    """
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise DestinationRefused(f"cannot resolve {host}: {exc}") from exc
    addresses: list[IpAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        reason = refusal(address, allow_private=allow_private)
        if reason is not None:
            raise DestinationRefused(f"{host} resolves to {reason}")
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise DestinationRefused(f"{host} resolves to no address")
    return addresses


def check_destination(
    url: str, *, allow_private: bool, resolve: Resolver = socket.getaddrinfo
) -> CallbackUrl:
    """Parse ``url`` and check where it leads (``BadCallbackUrl``, ``DestinationRefused``)."""
    parsed = parse_callback_url(url)
    checked_addresses(parsed.host, parsed.port, allow_private=allow_private, resolve=resolve)
    return parsed
