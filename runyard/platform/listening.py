"""A LISTEN connection that heals itself: listen until stopped, reconnect with backoff."""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

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
        except Exception as exc:
            if isinstance(exc, psycopg.Error):
                logger.warning("%s connection lost; reconnecting", what, extra={"error": str(exc)})
            else:
                # A callback's own bug: the thread lives on, and whoever rests on what it
                # hears is told it is lost (else a gate would rest its longer period for good).
                logger.exception("%s failed; listening again", what)
            lost()
            stop.wait(delay)
            delay = min(delay * 2, 10.0)


def notifications(conn: psycopg.Connection[Any], timeout: float) -> list[psycopg.Notify]:
    """The notifications ``conn`` has received, else those that arrive within ``timeout``
    seconds (none if none did).

    The wait is a ``poll`` of the connection's socket: psycopg's own ``notifies(timeout=)``
    wakes every 0.1 s to look for signals, ten wake-ups a second that an idle listener would
    pay for all day. A connection that failed raises ``psycopg.OperationalError``.
    """
    deadline = time.monotonic() + timeout
    waiting = select.poll()
    waiting.register(conn.fileno(), select.POLLIN)
    while True:
        # Those read with another statement's answer wait in psycopg's backlog, not on the
        # socket; what the socket holds is read here, and its end raises.
        got = list(conn.notifies(timeout=0))
        if got:
            return got
        left = deadline - time.monotonic()
        # Readable without a notification (a notice, the server's last words before it
        # closes): wait on for the rest of the time.
        if left <= 0 or not waiting.poll(left * 1000):
            return []
