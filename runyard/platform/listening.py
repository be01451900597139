"""A LISTEN connection that heals itself: listen until stopped, reconnect with backoff."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

logger = logging.getLogger(__name__)


def listen_until_stopped(
    listen: Callable[[], None], stop: threading.Event, lost: Callable[[], None], what: str
) -> None:
    """Call ``listen`` (which returns once ``stop`` is set) again and again: after a lost
    connection, ``lost`` is told (something may have been missed), then a backoff of 0.5 s
    doubling to 10 s."""
    delay = 0.5
    while not stop.is_set():
        try:
            listen()
            delay = 0.5
        except psycopg.Error as exc:
            logger.warning("%s connection lost; reconnecting", what, extra={"error": str(exc)})
            lost()
            stop.wait(delay)
            delay = min(delay * 2, 10.0)
