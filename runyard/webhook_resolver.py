"""Name resolution for webhook deliveries with a time limit and a bound on lookups in flight.

``getaddrinfo`` cannot be cancelled: a name server that never answers holds the calling
thread for as long as the system resolver's own retries last (often 30 s or more). So each
lookup runs on a thread of its own and the caller waits at most its time limit; the thread
finishes whenever the system resolver gives up. At most ``threads`` lookups are in progress
at once, abandoned ones included: past that a lookup fails at once with a clear error rather
than pile up threads behind a dead name server.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

from runyard.webhook_urls import Resolver


class ResolverSaturated(OSError):
    """Every lookup slot is taken by a lookup still waiting for its name server."""


class BoundedResolver:
    """A ``getaddrinfo`` stand-in: the same call, a time limit, a bound on threads."""

    def __init__(
        self,
        *,
        threads: int,
        timeout_seconds: float,
        getaddrinfo: Resolver = socket.getaddrinfo,
    ) -> None:
        self._threads = threads
        self._timeout = timeout_seconds
        self._getaddrinfo = getaddrinfo
        self._slots = threading.BoundedSemaphore(threads)
        self._lock = threading.Lock()
        self._busy = 0

    @property
    def busy(self) -> int:
        """Lookups still in progress, those whose callers gave up included."""
        with self._lock:
            return self._busy

    def __call__(self, host: str, port: int, *args: Any, **kwargs: Any) -> Sequence[Any]:
        """``getaddrinfo(host, port, ...)``, or ``TimeoutError`` after the time limit, or
        ``ResolverSaturated`` at once when every slot is taken."""
        if not self._slots.acquire(blocking=False):
            raise ResolverSaturated(
                f"{self._threads} name lookups are already waiting for an answer "
                "(RUNYARD_WEBHOOK_RESOLVER_THREADS); not resolving now"
            )
        with self._lock:
            self._busy += 1
        done = threading.Event()
        outcome: list[Any] = []

        def lookup() -> None:
            try:
                outcome.append(self._getaddrinfo(host, port, *args, **kwargs))
            except BaseException as exc:
                outcome.append(exc)
            finally:
                with self._lock:
                    self._busy -= 1
                self._slots.release()
                done.set()

        # A daemon thread: a lookup still stuck when the process exits must not hold it.
        threading.Thread(target=lookup, name="runyard-resolve", daemon=True).start()
        if not done.wait(self._timeout):
            raise TimeoutError(f"no answer from the name server within {self._timeout:g} s")
        [result] = outcome
        if isinstance(result, BaseException):
            raise result
        return list(result)
