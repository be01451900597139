"""Name resolution for webhook deliveries with a time limit and a bound on lookups in flight.

``getaddrinfo`` cannot be cancelled: a name server that never answers holds the calling
thread for as long as the system resolver's own retries last (often 30 s or more). So each
lookup runs on a thread of its own and the caller waits at most its time limit; the thread
finishes whenever the system resolver gives up. At most ``threads`` lookups are in progress
at once, abandoned ones included, and at most ``per_key`` of one tenant's: past that a lookup
fails at once with a clear error rather than pile up threads behind a dead name server.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from runyard.webhooks.urls import Resolver


class ResolverSaturated(OSError):
    """Every lookup slot is taken by a lookup still waiting for its name server."""


class BoundedResolver:
    """A ``getaddrinfo`` stand-in: the same call, a time limit, a bound on threads in all and
    per key (the tenant whose delivery asks: one tenant's names that never answer use up its
    own share of lookups, never everyone's)."""

    def __init__(
        self,
        *,
        threads: int,
        timeout_seconds: float,
        per_key: int | None = None,
        getaddrinfo: Resolver = socket.getaddrinfo,
    ) -> None:
        self._threads = threads
        self._per_key = min(per_key or threads, threads)
        self._timeout = timeout_seconds
        self._getaddrinfo = getaddrinfo
        self._lock = threading.Lock()
        self._busy: Counter[str | None] = Counter()

    @property
    def busy(self) -> int:
        """Lookups still in progress, those whose callers gave up included."""
        with self._lock:
            return self._busy.total()

    def for_key(self, key: str) -> Resolver:
        """This resolver, its lookups counted against ``key``'s share."""
        return functools.partial(self._resolve, key)

    def __call__(self, host: str, port: int, *args: Any, **kwargs: Any) -> Sequence[Any]:
        """``getaddrinfo(host, port, ...)``, or ``TimeoutError`` after the time limit, or
        ``ResolverSaturated`` at once when every slot is taken."""
        return self._resolve(None, host, port, *args, **kwargs)

    def _take(self, key: str | None) -> None:
        with self._lock:
            if self._busy.total() >= self._threads:
                raise ResolverSaturated(
                    f"{self._threads} name lookups are already waiting for an answer "
                    "(RUNYARD_WEBHOOK_RESOLVER_THREADS); not resolving now"
                )
            if key is not None and self._busy[key] >= self._per_key:
                raise ResolverSaturated(
                    f"{self._per_key} name lookups of this tenant's webhooks are already "
                    "waiting for an answer; not resolving now"
                )
            self._busy[key] += 1

    def _give_back(self, key: str | None) -> None:
        with self._lock:
            self._busy[key] -= 1
            if not self._busy[key]:
                del self._busy[key]

    def _resolve(
        self, key: str | None, host: str, port: int, *args: Any, **kwargs: Any
    ) -> Sequence[Any]:
        self._take(key)
        done = threading.Event()
        outcome: list[Any] = []

        def lookup() -> None:
            try:
                outcome.append(self._getaddrinfo(host, port, *args, **kwargs))
            except BaseException as exc:
                outcome.append(exc)
            finally:
                self._give_back(key)
                done.set()

        # A daemon thread: a lookup still stuck when the process exits must not hold it.
        threading.Thread(target=lookup, name="runyard-resolve", daemon=True).start()
        if not done.wait(self._timeout):
            raise TimeoutError(f"no answer from the name server within {self._timeout:g} s")
        [result] = outcome
        if isinstance(result, BaseException):
            raise result
        return list(result)
