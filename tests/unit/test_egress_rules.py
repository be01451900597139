"""Egress rules: parsing, matching, and the refusal of private and metadata addresses."""

from __future__ import annotations

import ipaddress

import pytest

from runyard.domain.egress import EgressRule, decide, egress_problems, parse_rule


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("api.example.org:443", EgressRule("api.example.org", 443)),
        ("API.Example.org:443", EgressRule("api.example.org", 443)),
        ("*.example.org:443", EgressRule("*.example.org", 443)),
        ("10.1.2.3:8080", EgressRule("10.1.2.3", 8080)),
        ("[fd00::1]:80", EgressRule("fd00::1", 80)),
    ],
)
def test_parse_rule__reads_names_wildcards_and_addresses(text: str, rule: EgressRule):
    assert parse_rule(text) == rule


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("example.org", "must be host:port"),
        (":443", "must be host:port"),
        ("example.org:0", "port must be a number from 1 to 65535"),
        ("example.org:https", "port must be a number"),
        ("exa mple.org:80", "is no host name"),
        ("a.*.org:80", "is no host name"),
        ("*.org:443", "a wildcard needs a domain of two labels"),
        ("[example.org]:80", "is no IPv6 address"),
    ],
)
def test_parse_rule__refuses_what_is_no_rule_clearly(text: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_rule(text)


def test_egress_problems__one_line_per_bad_rule_and_a_cap():
    assert egress_problems(["ok.example:1", "bad"]) == [
        "egress 'bad' must be host:port (e.g. 'api.example.org:443')"
    ]
    assert egress_problems([f"h{n}.example:1" for n in range(65)])[0].startswith(
        "egress has 65 rules; at most 64"
    )


PUBLIC = ipaddress.ip_address("93.184.216.34")
RULES = [parse_rule(r) for r in ("api.example.org:443", "*.cdn.example:443", "10.9.8.7:8080")]


@pytest.mark.parametrize(
    ("host", "port", "address", "refusal"),
    [
        ("api.example.org", 443, PUBLIC, None),
        ("API.example.org.", 443, PUBLIC, None),
        ("api.example.org", 80, PUBLIC, "api.example.org:80 is not on the tool's egress list"),
        ("a.b.cdn.example", 443, PUBLIC, None),
        ("cdn.example", 443, PUBLIC, "cdn.example:443 is not on the tool's egress list"),
        ("evilcdn.example", 443, PUBLIC, "evilcdn.example:443 is not on the tool's egress list"),
        ("10.9.8.7", 8080, ipaddress.ip_address("10.9.8.7"), None),
        ("10.9.8.6", 8080, ipaddress.ip_address("10.9.8.6"), "10.9.8.6:8080 is not on"),
        ("api.example.org", 443, ipaddress.ip_address("10.0.0.1"), "10.0.0.1 is a private"),
        ("api.example.org", 443, ipaddress.ip_address("127.0.0.1"), "127.0.0.1 is a loopback"),
        ("api.example.org", 443, ipaddress.ip_address("169.254.169.254"), "is the metadata"),
        ("api.example.org", 443, ipaddress.ip_address("169.254.1.1"), "is a link-local"),
        ("api.example.org", 443, ipaddress.ip_address("::1"), ":1 is a loopback"),
        ("api.example.org", 443, ipaddress.ip_address("0.0.0.0"), "is a private"),
    ],
)
def test_decide__allows_listed_public_destinations_only(
    host: str, port: int, address: ipaddress.IPv4Address, refusal: str | None
):
    decided = decide(RULES, host, port, address)
    if refusal is None:
        assert decided is None
    else:
        assert decided is not None and refusal in decided, decided


def test_rule__prints_as_written():
    assert [str(parse_rule(r)) for r in ("a.example:1", "[fd00::1]:80", "*.x.example:2")] == [
        "a.example:1",
        "[fd00::1]:80",
        "*.x.example:2",
    ]
