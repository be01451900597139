"""One call at a time on a helper thread, waited on for a bounded time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class CallBusy(Exception):
    """The previous call has not returned yet; no new one was started."""


class CallTimedOut(Exception):
    """The call did not return in time; it goes on in its thread, unwaited."""


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class BoundedCall:
    """Runs ``fn`` in a fresh daemon thread and waits at most ``timeout`` for it.

    A call stuck on a silent peer cannot be interrupted from Python; the caller stops
    waiting, and no second call starts until the stuck one returns, so threads do not pile
    up. ``thread_id`` names the thread to unstick (its connection can be cut).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def thread_id(self) -> int | None:
        """The ident of the thread of a call still running, if any."""
        thread = self._thread
        return thread.ident if thread is not None and thread.is_alive() else None

    def run(self, fn: Callable[[], T], timeout: float) -> T:
        """``fn()``'s value or exception; ``CallTimedOut`` or ``CallBusy`` otherwise."""
        if self.thread_id is not None:
            raise CallBusy(self._name)
        outcome: _Outcome[T] = _Outcome()

        def target() -> None:
            try:
                outcome.value = fn()
            except BaseException as exc:
                outcome.error = exc
            finally:
                outcome.done.set()

        self._thread = threading.Thread(target=target, name=self._name, daemon=True)
        self._thread.start()
        if not outcome.done.wait(timeout):
            raise CallTimedOut(f"{self._name} did not return within {timeout:g}s")
        if outcome.error is not None:
            raise outcome.error
        return outcome.value  # type: ignore[return-value]
