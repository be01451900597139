"""Webhook destinations: which URLs are accepted, and which addresses may be connected to.

A webhook makes runyard send a request to a place a tenant names. Left open, that lets a
tenant reach what only the platform can (the database, a cloud metadata service, an admin
port on loopback): server-side request forgery. So a destination must resolve to public
addresses only. When the URL is given, what can be judged without DNS is (an address written
in it, a loopback name); every delivery resolves the name with a time limit, checks every
address, and connects to the very address it checked (DNS can change).
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
    """The destination resolves to an address webhooks may not reach (or does not resolve).

    The message is for the tenant; ``address``, the refused address, only for operators' logs.
    """

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


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


@dataclass(frozen=True)
class DestinationPolicy:
    """Which non-public ranges webhooks may reach besides public addresses (none by default).

    ``allow_private`` opens private networks (RFC 1918, carrier-grade NAT, unique local and
    site-local IPv6); ``allow_loopback`` opens loopback, for tests and development. Link-local
    addresses (169.254/16, fe80::/10), where cloud metadata services answer, and the known
    metadata addresses are never allowed: nothing receives webhooks there that could not
    receive them elsewhere, and what does answer there hands out the platform's credentials.
    """

    allow_private: bool = False
    allow_loopback: bool = False


STRICT = DestinationPolicy()

# Private networks: what allow_private opens. Site-local (fec0::/10) is the deprecated
# predecessor of unique local addresses and is treated as one.
PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7",
              "fec0::/10")
)  # fmt: skip
# Cloud metadata services outside link-local (Alibaba's in carrier-grade NAT space, AWS's
# IPv6 one in unique local space): refused even where their range is allowed.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254")
)
# IPv6 forms that carry an IPv4 address in their last 32 bits, judged by that address.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
# IPv4-translated (SIIT, ``::ffff:0:a.b.c.d``): not IPv4-mapped, so ``ipv4_mapped`` misses it.
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
# IPv6 ranges refused whatever they carry: the local-use NAT64 prefix (where the IPv4 address
# sits depends on the site's prefix length) and Teredo (tunnel endpoints, never a receiver).
_REFUSED_V6 = {
    ipaddress.ip_network("64:ff9b:1::/48"): "a local-use NAT64",
    ipaddress.ip_network("2001::/32"): "a Teredo",
}


def embedded_ipv4(address: IpAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, IPv4-translated,
    IPv4-compatible, NAT64, 6to4)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or address in _IPV4_TRANSLATED:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal(address: IpAddress, policy: DestinationPolicy = STRICT) -> str | None:
    """Why webhooks may not reach ``address`` (None: they may); says the address and its kind.

    Public unicast addresses are allowed; private ranges and loopback only as ``policy``
    says; link-local, metadata, multicast, unspecified and reserved addresses never. An IPv6
    address that embeds an IPv4 one is judged as that IPv4 address.
    """
    inner = embedded_ipv4(address)
    if inner is not None:
        reason = refusal(inner, policy)
        return None if reason is None else f"{address} embeds {reason}"
    if address.version == 6:
        for network, kind in _REFUSED_V6.items():
            if address in network:
                return f"{address} is {kind} address"
    if address.is_unspecified or address.is_multicast:
        return f"{address} is an unspecified or multicast address"
    if address.is_link_local or address in METADATA_ADDRESSES:
        return f"{address} is a link-local or cloud metadata address (never allowed)"
    if address.is_loopback:
        if policy.allow_loopback:
            return None
        return f"{address} is a loopback address (RUNYARD_WEBHOOK_ALLOW_LOOPBACK allows it)"
    if any(address in network for network in PRIVATE_NETWORKS):
        if policy.allow_private:
            return None
        return f"{address} is a private address (RUNYARD_WEBHOOK_ALLOW_PRIVATE allows it)"
    if address.is_global:
        return None
    return f"{address} is a reserved, non-public address"


def literal_address(host: str) -> IpAddress | None:
    """The address ``host`` spells, if it is one: IPv6, dotted IPv4, or the shorthand IPv4
    forms the resolver would also read as addresses (``127.1``, ``0x7f.0.0.1``,
    ``2130706433``)."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if not host or any(ch not in "0123456789abcdefx." for ch in host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _loopback_name(host: str) -> bool:
    # RFC 6761: localhost and every name under it are loopback, whatever DNS would say.
    return host == "localhost" or host.endswith(".localhost")


def checked_addresses(
    host: str, port: int, policy: DestinationPolicy = STRICT, resolve: Resolver = socket.getaddrinfo
) -> list[IpAddress]:
    """Every address ``host`` resolves to, all of them allowed; else ``DestinationRefused``.

    One refused address refuses the host: a name that resolves to a public and a private
    address could otherwise be steered to the private one. For a name, the refusal says that
    it resolves to a non-public address, never which (a tenant learns nothing of the
    platform's network); the address itself is in ``DestinationRefused.address``.
    """
    literal = literal_address(host)
    if literal is not None:
        reason = refusal(literal, policy)
        if reason is not None:
            raise DestinationRefused(reason, address=str(literal))
        return [literal]
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise DestinationRefused(f"cannot resolve {host}: {exc}") from exc
    addresses: list[IpAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if refusal(address, policy) is not None:
            raise DestinationRefused(
                f"{host} resolves to a non-public address", address=str(address)
            )
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise DestinationRefused(f"{host} resolves to no address")
    return addresses


def check_destination(url: str, policy: DestinationPolicy = STRICT) -> CallbackUrl:
    """Parse ``url`` and refuse what is non-public without asking DNS (``BadCallbackUrl``,
    ``DestinationRefused``): an address written in the URL, or a loopback name.

    Names are resolved and checked at every delivery attempt instead, by a resolver with a
    time limit; a check here would hold a request on DNS and prove nothing, since the
    answer may change before the delivery.
    """
    parsed = parse_callback_url(url)
    literal = literal_address(parsed.host)
    if literal is not None:
        reason = refusal(literal, policy)
        if reason is not None:
            raise DestinationRefused(reason, address=str(literal))
    elif _loopback_name(parsed.host) and not policy.allow_loopback:
        raise DestinationRefused(
            f"{parsed.host} is a loopback name (RUNYARD_WEBHOOK_ALLOW_LOOPBACK allows it)"
        )
    return parsed


def destination_key(url: str) -> str:
    """Where ``url`` delivers, as ``host:port``: the unit of the per-destination cap and of
    the circuit breaker (an unparseable URL is a destination of its own)."""
    try:
        parsed = parse_callback_url(url)
    except BadCallbackUrl:
        return "invalid:" + url[:200]
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    return f"{host}:{parsed.port}"
