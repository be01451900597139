"""The bounded resolver of webhook deliveries, with a stand-in for getaddrinfo that the test
holds (the real system resolver in a namespace of its own: tests/integration/queue/
test_webhook_dns.py)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from runyard.webhooks.resolver import BoundedResolver, ResolverSaturated
from runyard.webhooks.urls import DestinationRefused, checked_addresses

ANSWER = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443))]


class HeldLookup:
    """getaddrinfo that answers only once ``release`` is set; counts its calls."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, host: str, port: int, **kwargs: Any) -> list[tuple[Any, ...]]:
        self.calls += 1
        self.release.wait(30)
        return ANSWER


def test_bounded_resolver__answers_what_getaddrinfo_answers():
    resolver = BoundedResolver(
        threads=2, timeout_seconds=5, getaddrinfo=lambda host, port, **kw: ANSWER
    )
    assert resolver("hooks.example", 443, type=socket.SOCK_STREAM) == ANSWER
    assert resolver.busy == 0


def test_bounded_resolver__gives_up_at_its_time_limit_and_the_lookup_keeps_its_slot():
    held = HeldLookup()
    resolver = BoundedResolver(threads=2, timeout_seconds=0.2, getaddrinfo=held)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 0\.2 s"):
        resolver("slow.example", 443)
    assert time.monotonic() - started < 5
    assert resolver.busy == 1  # still waiting for its name server
    held.release.set()
    deadline = time.monotonic() + 5
    while resolver.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert resolver.busy == 0


def test_bounded_resolver__fails_at_once_when_every_slot_is_stuck():
    held = HeldLookup()
    resolver = BoundedResolver(threads=2, timeout_seconds=0.1, getaddrinfo=held)
    for _ in range(2):
        with pytest.raises(TimeoutError):
            resolver("stuck.example", 443)
    started = time.monotonic()
    with pytest.raises(ResolverSaturated, match="RUNYARD_WEBHOOK_RESOLVER_THREADS"):
        resolver("another.example", 443)
    assert time.monotonic() - started < 0.1 + 1  # no wait for a slot
    assert held.calls == 2  # the third lookup never started a thread
    held.release.set()


def test_bounded_resolver__errors_of_the_lookup_are_its_caller_errors():
    def fails(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    resolver = BoundedResolver(threads=1, timeout_seconds=5, getaddrinfo=fails)
    with pytest.raises(socket.gaierror):
        resolver("nowhere.invalid", 80)
    assert resolver.busy == 0


def test_checked_addresses__a_resolver_timeout_is_a_clear_refusal():
    held = HeldLookup()
    resolver = BoundedResolver(threads=1, timeout_seconds=0.1, getaddrinfo=held)
    with pytest.raises(DestinationRefused) as refused:
        checked_addresses("slow.example", 443, resolve=resolver)
    assert str(refused.value) == (
        "cannot resolve slow.example: no answer from the name server within 0.1 s"
    )
    with pytest.raises(DestinationRefused, match="name lookups are already waiting"):
        checked_addresses("other.example", 443, resolve=resolver)
    held.release.set()


def test_bounded_resolver__one_key_uses_up_its_share_never_everyones():
    held = HeldLookup()

    def lookup(host: str, port: int, **kwargs: Any) -> list[tuple[Any, ...]]:
        return held(host, port) if host.startswith("never") else ANSWER

    resolver = BoundedResolver(threads=3, timeout_seconds=0.1, per_key=2, getaddrinfo=lookup)
    flood = resolver.for_key("flood")
    for i in range(2):
        with pytest.raises(TimeoutError):
            flood(f"never-{i}.example", 443)
    with pytest.raises(ResolverSaturated, match="of this tenant"):
        flood("never-2.example", 443)
    assert resolver.for_key("quiet")("hooks.example", 443) == ANSWER  # its room is left
    assert resolver.busy == 2
    held.release.set()
