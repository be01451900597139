"""One webhook POST (``runyard.webhooks.http.post``): which failures say something of the
destination (a connection was tried and got no answer) and which are the sender's own (no
connection was tried), with resolvers as tables and loopback sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runyard.webhooks.http import HttpAttempt, post
from runyard.webhooks.resolver import BoundedResolver, ResolverSaturated
from runyard.webhooks.urls import DestinationPolicy, parse_callback_url

LOOPBACK = DestinationPolicy(allow_loopback=True)


def to_loopback(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


def saturated(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
    raise ResolverSaturated("4 name lookups of this tenant's webhooks are already waiting")


def slow_lookup(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
    time.sleep(0.3)  # past the attempt's whole timeout, but answers
    return to_loopback(host, port)


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def attempt(url: str, resolve: Any, timeout: float = 2.0) -> HttpAttempt:
    return post(
        parse_callback_url(url), b"{}", {}, timeout=timeout, policy=LOOPBACK, resolve=resolve
    )


def test_post__a_lookup_the_tenant_has_no_share_left_for_never_connects():
    got = attempt("http://shared.test:9/h", saturated)
    assert got.error is not None and got.error.startswith("refused: cannot resolve shared.test")
    assert not got.connected and not got.unanswered


def test_post__a_refused_address_never_connects():
    got = post(
        parse_callback_url("http://shared.test:9/h"), b"{}", {}, timeout=2.0, resolve=to_loopback
    )
    assert got.refused_address == "127.0.0.1"
    assert not got.connected and not got.unanswered


def test_post__a_lookup_that_took_the_whole_timeout_never_connects(silent_port: int):
    got = attempt(f"http://shared.test:{silent_port}/h", slow_lookup, timeout=0.2)
    assert got.error == "timed out after 0.2 s"
    assert not got.connected and not got.unanswered


def test_post__a_lookup_past_its_time_limit_never_connects():
    answer = threading.Event()

    def never(host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        answer.wait(10)
        raise OSError("no answer")

    resolver = BoundedResolver(threads=2, timeout_seconds=0.2, getaddrinfo=never)
    try:
        got = attempt("http://never.test:9/h", resolver)
    finally:
        answer.set()
    assert got.error is not None and "no answer from the name server" in got.error
    assert not got.connected and not got.unanswered


def test_post__a_refused_connection_is_the_destinations_failure(closed_port: int):
    got = attempt(f"http://shared.test:{closed_port}/h", to_loopback)
    assert got.error is not None and got.error.startswith("ConnectionRefusedError")
    assert got.connected and got.unanswered


def test_post__a_connection_that_gets_no_answer_is_the_destinations_failure(silent_port: int):
    got = attempt(f"http://shared.test:{silent_port}/h", to_loopback, timeout=0.3)
    assert got.error == "timed out after 0.3 s"
    assert got.connected and got.unanswered
