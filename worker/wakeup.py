"""LISTEN/NOTIFY wake-ups for the worker, on a dedicated connection that heals itself.

Polling stays the source of truth; a notification only makes the worker react sooner: a new
job wakes the claim loop, a cancel reaches the attempt before the next heartbeat, a job
written held wakes the flow gate, a job that waits for a build wakes the build round.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

import psycopg

from runyard.platform.listening import listen_until_stopped, notifications
from runyard.platform.settings import libpq_url
from runyard.queue import BUILDS_CHANNEL, CANCEL_CHANNEL, HELD_CHANNEL, JOBS_CHANNEL

logger = logging.getLogger(__name__)

HEALTH_CHECK_SECONDS = 15.0


class Wakeups:
    """Listens on the job and cancel channels (and the held and build ones when asked to);
    reconnects with backoff when the link drops.

    Without a URL (behind a transaction pooler with no direct one) it never listens: the
    claim loop polls, and a cancel arrives with the next heartbeat.
    """

    def __init__(
        self,
        database_url: str | None,
        on_job: Callable[[], None],
        on_cancel: Callable[[uuid.UUID], None],
        *,
        on_held: Callable[[], None] | None = None,
        on_build: Callable[[], None] | None = None,
        on_listening: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        self._url = None if database_url is None else libpq_url(database_url)
        self._on_job = on_job
        self._on_cancel = on_cancel
        self._on_held = on_held
        self._on_build = on_build
        # Told the channels heard once the link is up (an empty set once it is lost): only a
        # listener that hears every job of a kind may let what polls for that kind rest longer.
        self._on_listening = on_listening
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runyard-listen", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        """Start listening in the background (if there is a URL to listen on)."""
        if self._url is not None:
            self._thread.start()

    def stop(self) -> None:
        """Stop listening (within a second)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        listen_until_stopped(self._listen, self._stop, self._lost, "listen")

    def _lost(self) -> None:
        self.connected.clear()
        # Something may have been missed while disconnected: let the loop poll now, and the
        # flow gate and the build round look (told the link is lost, they look at once).
        self._on_job()
        if self._on_listening is not None:
            self._on_listening(frozenset())
        else:
            for wake in (self._on_held, self._on_build):
                if wake is not None:
                    wake()

    def _listen(self) -> None:
        assert self._url is not None
        with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"LISTEN {JOBS_CHANNEL}")
            conn.execute(f"LISTEN {CANCEL_CHANNEL}")
            heard = {JOBS_CHANNEL, CANCEL_CHANNEL}
            for channel, wake in ((HELD_CHANNEL, self._on_held), (BUILDS_CHANNEL, self._on_build)):
                if wake is not None:
                    conn.execute(f"LISTEN {channel}")
                    heard.add(channel)
            # Told first: once ``connected`` is set, whoever waits on it finds them told.
            if self._on_listening is not None:
                self._on_listening(frozenset(heard))
            self.connected.set()
            idle = 0.0
            while not self._stop.is_set():
                notes = notifications(conn, 1.0)
                for note in notes:
                    self._dispatch(note.channel, note.payload)
                idle = 0.0 if notes else idle + 1.0
                if idle >= HEALTH_CHECK_SECONDS:
                    conn.execute("SELECT 1")
                    idle = 0.0

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == JOBS_CHANNEL:
            self._on_job()
        elif channel == HELD_CHANNEL and self._on_held is not None:
            self._on_held()
        elif channel == BUILDS_CHANNEL and self._on_build is not None:
            self._on_build()
        elif channel == CANCEL_CHANNEL:
            try:
                self._on_cancel(uuid.UUID(payload))
            except ValueError:
                logger.warning(
                    "ignoring a malformed cancel notification", extra={"payload": payload}
                )
