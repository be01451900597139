"""LISTEN/NOTIFY wake-ups for the sandboxes a process serves: a new command (``INSERT_EXEC``
notifies ``runyard_sandbox_execs`` with the sandbox's id) wakes its owner's round at once.

Polling stays the source of truth: a round still comes every second without a notification,
and a lost connection wakes every sandbox (something may have been missed) and reconnects.
"""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg

from runyard.platform.listening import listen_until_stopped, notifications
from runyard.platform.settings import libpq_url

logger = logging.getLogger(__name__)

EXEC_CHANNEL = "runyard_sandbox_execs"


class ExecWakeups:
    """One listening connection for every sandbox of the process, started on first use."""

    def __init__(self, database_url: str | None) -> None:
        self._url = None if database_url is None else libpq_url(database_url)
        self._events: dict[uuid.UUID, threading.Event] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        """Whether notifications can come (there is a URL to listen on)."""
        return self._url is not None

    def event(self, run_id: uuid.UUID) -> threading.Event:
        """The event a notification for ``run_id`` sets; starts the listener if needed."""
        with self._lock:
            if self._thread is None and self._url is not None:
                self._thread = threading.Thread(
                    target=self._run, name="runyard-sandbox-listen", daemon=True
                )
                self._thread.start()
            return self._events.setdefault(run_id, threading.Event())

    def forget(self, run_id: uuid.UUID) -> None:
        """The sandbox is no longer served here."""
        with self._lock:
            self._events.pop(run_id, None)

    def stop(self) -> None:
        """Stop listening (within a second or so)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _wake_all(self) -> None:
        with self._lock:
            for event in self._events.values():
                event.set()

    def _run(self) -> None:
        listen_until_stopped(self._listen, self._stop, self._wake_all, "sandbox listen")

    def _listen(self) -> None:
        assert self._url is not None
        with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"LISTEN {EXEC_CHANNEL}")
            self._wake_all()  # anything sent before the LISTEN is found by the round it wakes
            while not self._stop.is_set():
                for note in notifications(conn, 1.0):
                    try:
                        run_id = uuid.UUID(note.payload)
                    except ValueError:
                        continue
                    with self._lock:
                        found = self._events.get(run_id)
                    if found is not None:
                        found.set()
