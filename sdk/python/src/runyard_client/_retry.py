"""When a failed request is sent again, and after how long: pure decisions both clients use."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from runyard_client.errors import RunyardError, is_transient

# Methods that change nothing, or change it the same way however often they are sent.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter for transient failures of safe requests."""

    max_retries: int = 3
    base_seconds: float = 0.5
    max_seconds: float = 8.0

    def backoff(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """The pause before retry number ``retry`` (0 first): half the capped exponential
        step, plus up to as much again at random, so clients that failed together spread."""
        step = min(self.max_seconds, self.base_seconds * 2.0**retry)
        return step / 2 + step / 2 * rand()

    def delay(
        self,
        retry: int,
        error: RunyardError,
        *,
        safe: bool,
        rand: Callable[[], float] = random.random,
    ) -> float | None:
        """Seconds to wait before sending the request again, or None to give up with
        ``error``: only a transient failure of a safe request, at most ``max_retries``
        times; a ``Retry-After`` is honoured up to ``max_seconds``."""
        if not safe or not is_transient(error) or retry >= self.max_retries:
            return None
        pause = self.backoff(retry, rand)
        if error.retry_after is not None:
            pause = max(pause, min(error.retry_after, self.max_seconds))
        return pause


def is_safe(method: str, headers: Mapping[str, str]) -> bool:
    """Whether sending the request twice does no more than sending it once: reads, deletes,
    and anything that carries an ``Idempotency-Key``."""
    if method.upper() in SAFE_METHODS:
        return True
    return any(key.lower() == "idempotency-key" for key in headers)
