"""Egress allow-lists: which destinations a tool with ``egress = [...]`` may reach.

A rule is ``host:port``: a DNS name, ``*.`` and a domain (any name under it, never the
domain itself), or an IP address (IPv6 in brackets). A connection is allowed when a rule
matches its host and port *and* the address it resolved to is public; private, loopback,
link-local (the metadata address among them), multicast and reserved addresses are refused
unless a rule names that very address. Pure and standard-library only: the egress proxy
runs this module inside its container (``runyard.runners.docker.egress``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_RULES = 64
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"({_LABEL}\.)*{_LABEL}")
# Cloud metadata services: link-local already, named for the refusal's message.
METADATA_ADDRESSES = frozenset({"169.254.169.254", "fd00:ec2::254"})

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class EgressRule:
    """One allowed destination: a host (a name, ``*.domain`` or an address) and a port."""

    host: str
    port: int

    @property
    def address(self) -> Address | None:
        """The rule's IP address, if it names one."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    def matches(self, host: str, port: int) -> bool:
        """Whether a connection to ``host:port`` (as the tool asked) falls under this rule."""
        if port != self.port:
            return False
        host = host.lower().rstrip(".")
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        if self.address is not None:
            return _as_address(host) == self.address
        return host == self.host

    def __str__(self) -> str:
        address = self.address
        host = f"[{self.host}]" if address is not None and address.version == 6 else self.host
        return f"{host}:{self.port}"


def parse_rule(text: str) -> EgressRule:
    """The rule ``text`` says; ValueError with a message a person understands otherwise."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"egress {text!r} must be host:port (e.g. 'api.example.org:443')")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"egress {text!r}: the port must be a number from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if _as_address(host) is None:
            raise ValueError(f"egress {text!r}: {host!r} in brackets is no IPv6 address")
    host = host.lower()
    if _as_address(host) is None:
        name = host[2:] if host.startswith("*.") else host
        if not _NAME.fullmatch(name) or len(name) > 253 or "*" in name:
            raise ValueError(
                f"egress {text!r}: {host!r} is no host name, '*.' and a domain, or IP address"
            )
        if host.startswith("*.") and "." not in name:
            raise ValueError(f"egress {text!r}: a wildcard needs a domain of two labels at least")
    else:
        host = str(_as_address(host))
    return EgressRule(host, int(port_text))


def egress_problems(rules: Sequence[str]) -> list[str]:
    """What is wrong with a tool's ``egress`` list, one line each (empty: nothing)."""
    problems = []
    if len(rules) > MAX_RULES:
        problems.append(f"egress has {len(rules)} rules; at most {MAX_RULES}")
    for text in rules:
        try:
            parse_rule(text)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def _as_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def address_refusal(address: Address) -> str | None:
    """Why ``address`` is no public destination (None: it is)."""
    if str(address) in METADATA_ADDRESSES:
        return "the metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_private or address.is_reserved or address.is_unspecified:
        return "a private address"
    if address.is_multicast:
        return "a multicast address"
    return None


def decide(rules: Sequence[EgressRule], host: str, port: int, address: Address) -> str | None:
    """Why a connection to ``host:port``, resolved to ``address``, is refused (None: it is
    allowed)."""
    rule = next((rule for rule in rules if rule.matches(host, port)), None)
    if rule is None:
        return unlisted(rules, host, port)
    refusal = address_refusal(address)
    if refusal is not None and rule.address != address:
        return f"{address} is {refusal}, not listed by address"
    return None


def unlisted(rules: Sequence[EgressRule], host: str, port: int) -> str | None:
    """Why ``host:port`` is refused before it is even looked up (None: a rule lists it)."""
    if any(rule.matches(host, port) for rule in rules):
        return None
    return f"{host}:{port} is not on the tool's egress list"
