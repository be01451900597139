"""A one-line progress indicator the CLI draws on a terminal while it waits."""

from __future__ import annotations

import threading
import time
from typing import TextIO

FRAMES = "|/-\\"


class Spinner:
    """Redraws ``<frame> <status> <elapsed>`` from a thread; clears its line when done.

    When not ``enabled`` (stderr is not a terminal, or output is JSON) it draws nothing.
    """

    def __init__(self, out: TextIO, *, enabled: bool, interval: float = 0.1) -> None:
        self._out = out
        self._enabled = enabled
        self._interval = interval
        self._status = "submitting"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()

    def update(self, status: str) -> None:
        """The status to show from now on."""
        self._status = status

    def _draw(self) -> None:
        tick = 0
        while not self._stop.wait(self._interval):
            elapsed = time.monotonic() - self._started
            self._out.write(f"\r{FRAMES[tick % 4]} {self._status} {elapsed:5.1f}s\033[K")
            self._out.flush()
            tick += 1

    def __enter__(self) -> Spinner:
        if self._enabled:
            self._thread = threading.Thread(target=self._draw, name="cli-spinner", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._out.write("\r\033[K")
            self._out.flush()
