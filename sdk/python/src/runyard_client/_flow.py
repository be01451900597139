"""The state of the calls that take more than one request — retries, deadlines, following an
event stream across connections, splitting log chunks into lines — shared by both clients,
which only do the I/O and the sleeping."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from runyard_client import _calls as calls
from runyard_client._calls import WAIT_SLICE_SECONDS, Call, Id, segment
from runyard_client._retry import RetryPolicy
from runyard_client.errors import (
    InvalidResponseError,
    RunyardError,
    WaitTimeoutError,
    is_transient,
)
from runyard_client.events import (
    Event,
    SkippedEvent,
    StderrEvent,
    StdoutEvent,
    event_from_sse,
    is_terminal,
)
from runyard_client.models import Batch, Run

T = TypeVar("T")
logger = logging.getLogger("runyard_client")
# A stream whose server sends nothing for this long (it sends a keepalive every 15 s by
# default) is taken for dead and reopened where it stopped.
STREAM_READ_SECONDS = 60.0
# Where a reconnect's pause starts when the server did not say (``retry:``).
RECONNECT_SECONDS = 1.0
# A long-poll answered sooner than this without the end (an API that holds answers for less,
# or not at all) is not asked again before this has passed since it was sent.
MIN_POLL_SECONDS = 1.0
# The largest event a stream may send (the API's log chunks are a few KiB): far above what
# it sends, low enough to bound memory whatever a server sends.
MAX_EVENT_BYTES = 16 * 1024 * 1024
# How much of why an event was skipped is kept.
SKIP_ERROR_CHARS = 300


class Attempts:
    """Counts the failures of one request: a pause before the next try, or the error."""

    def __init__(self, policy: RetryPolicy, *, safe: bool, what: str) -> None:
        self._policy = policy
        self._safe = safe
        self._what = what
        self._retries = 0

    def failed(self, error: RunyardError) -> float:
        """Seconds to pause before trying again; raises ``error`` when it may not retry."""
        pause = self._policy.delay(self._retries, error, safe=self._safe)
        if pause is None:
            raise error
        self._retries += 1
        logger.info(
            "retrying after a transient failure",
            extra={
                "request": self._what,
                "status": error.status,
                "code": error.code,
                "retry": self._retries,
                "pause_seconds": round(pause, 3),
            },
        )
        return pause

    def progressed(self) -> None:
        """The request got somewhere (bytes, events): later failures count from zero."""
        self._retries = 0


class Deadline:
    """A point in time after ``timeout`` seconds (None: never)."""

    def __init__(self, timeout: float | None, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._at = math.inf if timeout is None else clock() + max(timeout, 0.0)
        self.timeout = timeout

    def remaining(self) -> float:
        """Seconds left (``inf`` without a timeout, never below zero)."""
        return max(self._at - self._clock(), 0.0)

    def expired(self) -> bool:
        """Whether the time is up."""
        return self.remaining() <= 0.0

    def bound(self, seconds: float) -> float:
        """``seconds``, or what is left if that is less."""
        return min(seconds, self.remaining())


def finished(last: T, done: bool, deadline: Deadline, what: str) -> T:
    """``last`` if it is done, else the timeout error that carries it."""
    if done:
        return last
    raise WaitTimeoutError(f"{what} did not end within {deadline.timeout:g} s", last)


class LongPoll(Generic[T]):
    """Waiting for a run or a batch to end by long-polling its read (``?wait=``) in slices of
    at most ``WAIT_SLICE_SECONDS``: the next request, when it is over, the pause after an
    early answer or a transient failure (counted as for any request: the answers of the
    slices are progress), and past the deadline the timeout error with the last answer."""

    def __init__(
        self,
        ask: Callable[[float], Call[T]],
        done: Callable[[T], bool],
        what: str,
        policy: RetryPolicy,
        deadline: Deadline,
        min_gap: float = MIN_POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self._done = done
        self._what = what
        self._deadline = deadline
        self._min_gap = min_gap
        self._clock = clock
        self._attempts = Attempts(policy, safe=True, what=f"long-poll of {what}")
        self._sent_at = clock()
        self._over = False
        self.last: T | None = None

    def next_call(self) -> Call[T] | None:
        """The next request (a plain read once no time is left), or None when it is over."""
        if self._over:
            return None
        self._sent_at = self._clock()
        return self._ask(self._deadline.bound(WAIT_SLICE_SECONDS))

    def answered(self, value: T) -> float:
        """An answer came: the pause before the next request."""
        self.last = value
        self._attempts.progressed()
        if self._done(value) or self._deadline.expired():
            self._over = True
            return 0.0
        early = self._min_gap - (self._clock() - self._sent_at)
        return self._deadline.bound(max(early, 0.0))

    def failed(self, error: RunyardError) -> float:
        """The request failed with ``error``: the pause before sending it again; raises when
        it is not transient or repeats too often. Past the deadline the wait is over."""
        if is_transient(error) and self.last is not None and self._deadline.expired():
            self._over = True
            return 0.0
        return self._attempts.failed(error)

    def result(self) -> T:
        """The last answer if it is the end, else the timeout error that carries it."""
        assert self.last is not None, "the long-poll has not been answered"
        return finished(self.last, self._done(self.last), self._deadline, self._what)


def waiting_run(run_id: Id, timeout: float | None, policy: RetryPolicy) -> LongPoll[Run]:
    """Waiting for a run to end: ``GET /v1/runs/{id}?wait=``."""
    return LongPoll(
        lambda wait: calls.get_run(run_id, wait),
        lambda run: run.done,
        f"run {run_id}",
        policy,
        Deadline(timeout),
    )


def waiting_batch(
    batch_id: Id, timeout: float | None, policy: RetryPolicy, poll_seconds: float
) -> LongPoll[Batch]:
    """Waiting for a batch to end (no run queued or running): ``GET /v1/batches/{id}?wait=``;
    ``poll_seconds`` apart at least when the API answers at once."""
    return LongPoll(
        lambda wait: calls.get_batch(batch_id, wait),
        lambda batch: batch.done,
        f"batch {batch_id}",
        policy,
        Deadline(timeout),
        min_gap=poll_seconds,
    )


class EventFollow:
    """Following one run's events across connections: where to resume (``Last-Event-ID``:
    the last id received, never the largest, since ids are in commit order), when it ended,
    how long to pause before reconnecting, when to give up."""

    def __init__(
        self,
        run_id: Id,
        after: int | None,
        policy: RetryPolicy,
        deadline: Deadline | None = None,
        read_seconds: float = STREAM_READ_SECONDS,
        on_skip: Callable[[SkippedEvent], object] | None = None,
    ) -> None:
        self.path = f"/v1/runs/{segment(run_id)}/events"
        self._on_skip = on_skip
        self.last_id = "" if after is None else str(after)
        self.done = False
        self._deadline = deadline or Deadline(None)
        self._read_seconds = read_seconds
        self._attempts = Attempts(policy, safe=True, what=f"GET {self.path}")
        self._reconnect = RECONNECT_SECONDS
        self._progress = False

    def headers(self) -> dict[str, str]:
        """The headers of the next connection."""
        headers = {"Accept": "text/event-stream"}
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
        return headers

    def read_seconds(self) -> float:
        """How long one read of the next connection may wait for a byte."""
        return max(self._deadline.bound(self._read_seconds), 0.05)

    def connected(self, status: int) -> None:
        """The server answered ``status`` (< 400); 204: the run ended, nothing follows."""
        self._progress = False
        if status == 204:
            self.done = True

    def receive(self, event_id: str, kind: str, data: str, retry: int | None) -> Event | None:
        """One message: the typed event, or None for a message without an id and for one
        whose data is not what its type carries (skipped: logged, and given to ``on_skip``)."""
        if retry is not None:
            self._reconnect = min(max(retry / 1000, 0.1), 30.0)
        if not event_id or not data:
            return None
        self._progress = True
        self._attempts.progressed()
        if event_id.isascii() and event_id.isdigit():
            self.last_id = event_id  # resume after it, readable or not
        try:
            event = event_from_sse(event_id, kind, data)
        except ValueError as exc:  # not JSON, not an object, not the fields of its type
            self._skip(SkippedEvent(id=event_id, type=kind, error=str(exc)[:SKIP_ERROR_CHARS]))
            return None
        if is_terminal(event):
            self.done = True
        return event

    def _skip(self, skipped: SkippedEvent) -> None:
        logger.info(
            "skipped an event that is not what its type carries",
            extra={"event_id": skipped.id, "event_type": skipped.type, "error": skipped.error},
        )
        if self._on_skip is not None:
            self._on_skip(skipped)

    def failed(self, error: RunyardError) -> float:
        """The connection failed with ``error``: the pause before the next one; raises when
        the failure is not transient or repeats too often without progress. Past the
        deadline the follow ends instead."""
        if not is_transient(error):
            raise error
        if self._deadline.expired():
            self.done = True
            return 0.0
        if self._progress:
            self._progress = False
            return 0.0  # it dropped after delivering events: resume at once
        return max(self._attempts.failed(error), self._reconnect)

    def ended(self) -> float:
        """The server closed the stream before the run's final event (streams are bounded in
        time): the pause before resuming."""
        if self._deadline.expired():
            self.done = True
        return 0.0 if self.done else self._reconnect


class LineSplitter:
    """Log chunks of one or both streams in, whole lines out (each stream buffers its own
    unfinished line)."""

    def __init__(self, stream: str) -> None:
        self._streams = ("stdout", "stderr") if stream == "both" else (stream,)
        self._partial = dict.fromkeys(self._streams, "")

    def feed(self, event: Event) -> list[str]:
        """The lines ``event`` completes (none for other events or streams)."""
        if not isinstance(event, StdoutEvent | StderrEvent) or event.type not in self._partial:
            return []
        text = self._partial[event.type] + event.text
        *lines, self._partial[event.type] = text.split("\n")
        return lines

    def close(self) -> list[str]:
        """The unfinished lines left at the end."""
        rest = [text for text in self._partial.values() if text]
        self._partial = dict.fromkeys(self._streams, "")
        return rest


def log_lines(text: str) -> list[str]:
    """The lines of a whole log text."""
    return text.splitlines()


class EventLog:
    """Downloading a run's event log as NDJSON across connections: text in, whole lines out
    as the API wrote them; after a drop, the rest is asked for after the last event received.
    A line longer than ``MAX_EVENT_BYTES`` ends it (memory stays bounded)."""

    def __init__(
        self, run_id: Id, after: int | None, policy: RetryPolicy, max_bytes: int = MAX_EVENT_BYTES
    ) -> None:
        self.path = f"/v1/runs/{segment(run_id)}/events"
        self._after = after
        self._max_bytes = max_bytes
        self._attempts = Attempts(policy, safe=True, what=f"GET {self.path} (NDJSON)")
        self._pending: list[str] = []
        self._pending_size = 0

    def params(self) -> dict[str, str | int | float]:
        """The query of the next request."""
        params: dict[str, str | int | float] = {"format": "ndjson"}
        if self._after is not None:
            params["after"] = self._after
        return params

    def feed(self, text: str) -> list[str]:
        """The lines ``text`` completes (blank ones left out)."""
        *done, rest = text.split("\n")
        lines = []
        for piece in done:
            self._pending.append(piece)
            lines.append("".join(self._pending))
            self._pending, self._pending_size = [], 0
        if rest:
            self._pending.append(rest)
            self._pending_size += len(rest)
            if self._pending_size > self._max_bytes:
                raise InvalidResponseError(
                    f"a line of the event log is longer than {self._max_bytes} characters"
                )
        return [line for line in lines if self._received(line)]

    def close(self) -> list[str]:
        """The answer ended: its last line, if it had no newline."""
        line = "".join(self._pending)
        self._pending, self._pending_size = [], 0
        return [line] if self._received(line) else []

    def _received(self, line: str) -> bool:
        if not line.strip():
            return False
        self._attempts.progressed()
        try:
            self._after = int(json.loads(line)["id"])
        except (ValueError, TypeError, KeyError):
            pass  # not an event the API writes: handed on as it is, no place to resume
        return True

    def failed(self, error: RunyardError) -> float:
        """The download failed with ``error``: the pause before asking for the rest; raises
        when it may not retry. An unfinished line is dropped (it comes again)."""
        self._pending, self._pending_size = [], 0
        return self._attempts.failed(error)
