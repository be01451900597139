"""Database calls the heartbeat supervisor starts and watches, but never waits on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class OneAtATime:
    """Runs a call on a fresh daemon thread, one at a time, without waiting for it.

    A call stuck on a silent peer cannot be interrupted from Python: its watcher asks how long
    it has run (``busy_for``) and cuts its connection (``thread_id``). No second call starts
    while one runs, so stuck threads never pile up.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._flagged = False

    @property
    def thread_id(self) -> int | None:
        """The ident of the running call's thread, if a call runs."""
        with self._lock:
            thread = self._thread
        return thread.ident if thread is not None and thread.is_alive() else None

    def start(self, fn: Callable[[], None]) -> bool:
        """Start ``fn`` (which handles its own errors); False if the previous call still runs."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            self._thread = threading.Thread(target=self._guard, args=(fn,), name=self._name)
            self._thread.daemon = True
            self._started = time.monotonic()
            self._flagged = False
            self._thread.start()
        return True

    def busy_for(self) -> float | None:
        """Seconds the running call has run; None when none runs."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                return None
            return time.monotonic() - self._started

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the running call; True once none runs."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def overdue(self, limit: float) -> bool:
        """True once per call, when it has run longer than ``limit``."""
        ran = self.busy_for()
        with self._lock:
            if ran is None or ran <= limit or self._flagged:
                return False
            self._flagged = True
            return True

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            logger.exception("%s failed", self._name)
