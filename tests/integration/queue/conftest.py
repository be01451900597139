"""Webhook receivers shared by the queue's webhook tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.webhook_receiver import Receiver, receiver_on


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A receiver on loopback that answers every delivery."""
    with receiver_on() as made:
        yield made


@pytest.fixture
def dead() -> Iterator[Receiver]:
    """A receiver that takes every request and never answers (until the test ends)."""
    with receiver_on() as made:
        made.hold.clear()
        yield made
