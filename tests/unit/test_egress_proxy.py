"""The egress proxy's pure parts: what a request head asks for, and the runner's reading of
the proxy's event lines (hostile bytes included)."""

from __future__ import annotations

import json

import pytest

from api.ui.render import event_details, event_label
from runyard.platform.models import ToolRunEvent
from runyard.runners.docker.egress import MAX_EVENTS, MAX_LINE, proxy_program, read_events
from runyard.runners.docker.egress_proxy import read_target


@pytest.mark.parametrize(
    ("head", "target"),
    [
        (
            b"CONNECT api.example.org:443 HTTP/1.1\r\nHost: x\r\n\r\n",
            ("api.example.org", 443, None),
        ),
        (b"CONNECT [fd00::1]:8443 HTTP/1.1\r\n\r\n", ("fd00::1", 8443, None)),
        (
            b"GET http://10.0.0.5:8080/a?b HTTP/1.1\r\nHost: 10.0.0.5\r\n\r\n",
            ("10.0.0.5", 8080, b"GET /a?b HTTP/1.1\r\nHost: 10.0.0.5\r\n\r\n"),
        ),
        (
            b"GET http://example.org HTTP/1.0\r\n\r\n",
            ("example.org", 80, b"GET / HTTP/1.0\r\n\r\n"),
        ),
    ],
)
def test_read_target__connect_and_absolute_http(head: bytes, target: tuple[object, ...]):
    assert read_target(head) == target


@pytest.mark.parametrize(
    "head",
    [
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET https://example.org/ HTTP/1.1\r\n\r\n",
        b"garbage\r\n\r\n",
        b"CONNECT example.org:notaport HTTP/1.1\r\n\r\n",
    ],
)
def test_read_target__anything_else_is_refused(head: bytes):
    with pytest.raises(ValueError):
        read_target(head)


def _event(n: int) -> str:
    data = {"host": f"h{n}.example", "port": 443, "address": "", "allowed": False}
    return json.dumps({**data, "reason": "x", "bytes_out": 0, "bytes_in": 0, "seconds": 0})


def test_read_events__only_event_lines_at_most_the_cap():
    lines = ['{"listening": 3128}', "Traceback (most recent call last):", "{not json", "[1]"]
    lines += ["{" + "x" * MAX_LINE + "}"]
    lines += [_event(n) for n in range(MAX_EVENTS + 5)]
    events = read_events("\n".join(lines))
    assert len(events) == MAX_EVENTS
    assert events[0]["host"] == "h0.example"


def test_proxy_program__compiles_with_the_rules_beside_it():
    compile(proxy_program(), "proxy", "exec")


def test_read_target__a_host_longer_than_dns_allows_is_refused():
    with pytest.raises(ValueError, match="longer than DNS allows"):
        read_target(b"CONNECT " + b"a" * 300 + b".example:443 HTTP/1.1\r\n\r\n")


def test_event_label__names_the_verdict_and_destination_details_the_bytes():
    allowed = {"host": "api.example.org", "port": 443, "allowed": True, "reason": None}
    event = ToolRunEvent(type="egress", data={**allowed, "bytes_out": 517, "bytes_in": 4312})
    assert event_label(event) == "Egress allowed: api.example.org:443"
    assert event_details(event) == "bytes out: 517, bytes in: 4312"
    refused = ToolRunEvent(
        type="egress",
        data={"host": "10.0.0.1", "port": 80, "allowed": False, "reason": "a private address"},
    )
    assert event_label(refused) == "Egress refused: 10.0.0.1:80"
    assert event_details(refused) == "reason: a private address"
