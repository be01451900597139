"""Periodic background chores on a thread of their own, each on its own schedule.

A chore that fails is logged and runs again at its next turn; it never stops the others,
and none of them runs on a thread that renews anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from runyard.registry.reload import RegistryWatcher
from runyard.runner import RunnerUnavailable

logger = logging.getLogger(__name__)

# Expected when the database or the engine is sick: a line in the log, no traceback.
_SICK = (DBAPIError, PoolTimeoutError, RunnerUnavailable)


@dataclass(frozen=True)
class Chore:
    """``run`` every ``interval_seconds``, first at once; not before ``quiet_for()`` more
    seconds have passed when it says so (a chore that knows it has nothing to do: the loop
    sleeps through it rather than wake for a call that does nothing, unless ``poke``d)."""

    name: str
    interval_seconds: float
    run: Callable[[], object]
    quiet_for: Callable[[], float] | None = None


class Chores:
    """Runs each due chore in turn on one daemon thread until ``stop()``."""

    def __init__(self, chores: Sequence[Chore], *, thread_name: str = "runyard-chores") -> None:
        self._chores = list(chores)
        self._due = [0.0 for _ in self._chores]
        self._stop = threading.Event()
        # Set by ``poke`` and ``stop``: the loop looks at once at what is due.
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)

    def _next(self, index: int, now: float) -> float:
        """When the chore at ``index`` is due (monotonic seconds), seen at ``now``."""
        chore = self._chores[index]
        due = self._due[index]
        if chore.quiet_for is None:
            return due
        try:
            quiet = chore.quiet_for()
        except Exception:
            # Not quiet, then: the chore runs on its interval rather than the thread dying.
            logger.exception("%s could not say how long it rests", chore.name)
            quiet = 0.0
        return max(due, now + quiet)

    def run_due(self) -> float:
        """Run every chore that is due; the seconds until the next one is."""
        for index, chore in enumerate(self._chores):
            if self._stop.is_set():
                break
            now = time.monotonic()
            if now < self._next(index, now):
                continue
            self._due[index] = time.monotonic() + chore.interval_seconds
            try:
                chore.run()
            except _SICK as exc:
                logger.warning(
                    "%s failed; trying again at its next turn",
                    chore.name,
                    extra={"chore": chore.name, "error": f"{type(exc).__name__}: {exc}"[:300]},
                )
            except Exception:
                logger.exception("%s crashed", chore.name, extra={"chore": chore.name})
        now = time.monotonic()
        upcoming = (self._next(index, now) for index in range(len(self._chores)))
        return max(0.0, min(upcoming, default=now + 60.0) - now)

    def start(self) -> None:
        """Start the thread (nothing to do without chores; a second call does nothing)."""
        if self._chores and self._thread.ident is None:
            self._thread.start()

    def poke(self) -> None:
        """A quiet chore may have work now: look at once (any thread)."""
        self._poked.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to return and wait for the chore in progress, up to ``timeout``."""
        self._stop.set()
        self._poked.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            # Cleared before the look: a poke during the chores wakes the wait that follows.
            # ``stop`` is asked after the clear, which may have taken its wake-up.
            self._poked.clear()
            if self._stop.is_set():
                return
            self._poked.wait(self.run_due())


def registry_reload(watcher: RegistryWatcher, *, thread_name: str) -> Chores:
    """The chore that re-reads the tools file on the watcher's interval (none at 0)."""
    if watcher.interval_seconds <= 0:
        return Chores([], thread_name=thread_name)
    chore = Chore("tool registry reload", watcher.interval_seconds, watcher.check)
    return Chores([chore], thread_name=thread_name)
