"""A worker's batch completer: the finalizes its slots send within a few milliseconds of one
another go to the database as one statement (``JobQueue.finalize_many``).

No thread of its own: the first slot to ask leads; it waits until as many requests as the
worker has busy slots are gathered, or the window passes, then sends the batch and tells every
slot its own answer (whether its finalize applied, and the next job claimed for it). A batch
of one is the plain statement (``finalize``, ``finalize_and_claim``). A statement that fails
for a reason of its own values (``Failure.DETERMINISTIC``: an outcome the database refuses)
is sent again one request at a time, so each slot learns its own error and no outcome is
refused for another's; a passing failure reaches every slot of the batch, which retry as they
would their own statement. A statement writes all of its batch that applies, or nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from runyard.domain.attempt import AttemptResult
from runyard.platform.db_errors import Failure, classify
from runyard.queue.jobs import JobQueue
from runyard.queue.values import ClaimedJob, ClaimFor, Finalize

# How long the first request of a batch waits for the other busy slots' at most.
BATCH_WINDOW_SECONDS = 0.005

Answer = tuple[bool, list[ClaimedJob]]
T = TypeVar("T")
A = TypeVar("A")


@dataclass
class _Ask(Generic[T, A]):
    item: T
    answer: A | None = None
    error: BaseException | None = None
    done: bool = False
    # Set when the request is answered, or when its slot is to lead the next batch.
    woken: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Gatherer(Generic[T, A]):
    """Gathers the requests of busy slots into batches, led by the first slot to ask.

    ``send_many`` answers a batch, ``send_one`` a lone request; requests of different
    ``key``s never share a batch (a key of None joins any). Each slot is woken once, when it
    has its answer or is to lead: no slot wakes for another's.
    """

    send_many: Callable[[list[T]], list[A]]
    send_one: Callable[[T], A]
    busy: Callable[[], int]
    window: float
    key: Callable[[T], object] = lambda item: None
    batches: int = 0
    # Only the leader waits on it, for the batch to fill.
    _filled: threading.Condition = field(default_factory=threading.Condition)
    _pending: list[_Ask[T, A]] = field(default_factory=list)
    _leading: bool = False
    # Each slot thread's one event: a thread asks one request at a time, and its event is set
    # only for the request it waits on, so it is cleared and used again, not made anew.
    _wakers: threading.local = field(default_factory=threading.local)

    def ask(self, item: T) -> A:
        """Send ``item`` in the next batch; its own answer, or its own error raised."""
        ask: _Ask[T, A] = _Ask(item, woken=self._waker())
        with self._filled:
            self._pending.append(ask)
            leads = not self._leading
            self._leading = True
            if not leads and len(self._pending) >= self.busy():
                self._filled.notify()
        if not leads:
            ask.woken.wait()
        if not ask.done:
            self._lead(self._gather(ask))
        if ask.error is not None:
            raise ask.error
        return ask.answer  # type: ignore[return-value]  # set with done, error None

    def _waker(self) -> threading.Event:
        event: threading.Event | None = getattr(self._wakers, "event", None)
        if event is None:
            event = self._wakers.event = threading.Event()
        event.clear()
        return event

    def _gather(self, leader: _Ask[T, A]) -> list[_Ask[T, A]]:
        """Wait for the busy slots' requests, at most the window, then take every pending
        one of the leader's key (or of none)."""
        give_up = time.monotonic() + self.window
        with self._filled:
            while len(self._pending) < self.busy():
                left = give_up - time.monotonic()
                if left <= 0:
                    break
                self._filled.wait(left)
            keys = [self.key(ask.item) for ask in self._pending]
            key = self.key(leader.item)
            if key is None:
                key = next((k for k in keys if k is not None), None)
            batch: list[_Ask[T, A]] = []
            later: list[_Ask[T, A]] = []
            for ask, its in zip(self._pending, keys, strict=True):
                (batch if its is None or its == key else later).append(ask)
            self._pending = later
        return batch

    def _lead(self, batch: list[_Ask[T, A]]) -> None:
        """Send the batch and answer each of its slots; wake the next leader, if any."""
        try:
            self._answer(batch)
        finally:
            with self._filled:
                self.batches += 1
                for ask in batch:
                    if ask.error is None and ask.answer is None:
                        ask.error = RuntimeError("the batch ended without an answer")
                    ask.done = True
                    ask.woken.set()
                if self._pending:
                    self._pending[0].woken.set()  # asked meanwhile: it leads the next batch
                else:
                    self._leading = False

    def _answer(self, batch: list[_Ask[T, A]]) -> None:
        try:
            if len(batch) == 1:
                batch[0].answer = self.send_one(batch[0].item)
                return
            answers = self.send_many([ask.item for ask in batch])
        except Exception as exc:
            if len(batch) > 1 and classify(exc) is Failure.DETERMINISTIC:
                for ask in batch:  # each slot learns its own request's fate
                    try:
                        ask.answer = self.send_one(ask.item)
                    except Exception as own:
                        ask.error = own
                return
            for ask in batch:
                ask.error = exc
            return
        for ask, answer in zip(batch, answers, strict=True):
            ask.answer = answer


@dataclass(frozen=True)
class _Finalize:
    finalize: Finalize
    claim: ClaimFor | None


class BatchCompleter:
    """Finalizes (claiming the slots' next jobs) in batches; thread-safe.

    ``busy`` says how many slots hold an attempt now: the most requests worth waiting for.
    """

    def __init__(
        self,
        queue: JobQueue,
        *,
        busy: Callable[[], int],
        window_seconds: float = BATCH_WINDOW_SECONDS,
    ) -> None:
        self._queue = queue
        self.finalizes: _Gatherer[_Finalize, Answer] = _Gatherer(
            self._finalize_many, self._finalize_one, busy, window_seconds, key=_claim_of
        )

    def finalize(self, job_id: uuid.UUID, token: uuid.UUID, outcome: AttemptResult) -> bool:
        """``JobQueue.finalize``, in the next batch."""
        _check_terminal(outcome)
        owned, _ = self.finalizes.ask(_Finalize(Finalize(job_id, token, outcome), None))
        return owned

    def finalize_and_claim(
        self, job_id: uuid.UUID, token: uuid.UUID, outcome: AttemptResult, claim: ClaimFor
    ) -> Answer:
        """``JobQueue.finalize_and_claim`` of the slot's one next job, in the next batch."""
        _check_terminal(outcome)
        return self.finalizes.ask(_Finalize(Finalize(job_id, token, outcome, True), claim))

    def _finalize_one(self, request: _Finalize) -> Answer:
        one, target = request.finalize, request.claim
        if target is None:
            return self._queue.finalize(one.job_id, one.token, one.outcome), []
        return self._queue.finalize_and_claim(
            one.job_id,
            one.token,
            one.outcome,
            worker_id=target.worker_id,
            engine_id=target.engine_id,
            limit=1,
            lease_seconds=target.lease_seconds,
            queue=target.queue,
        )

    def _finalize_many(self, batch: list[_Finalize]) -> list[Answer]:
        """One statement: the batch claims (if at all) for one target (its key)."""
        target = next((r.claim for r in batch if r.claim is not None), None)
        applied, claimed = self._queue.finalize_many([r.finalize for r in batch], claim=target)
        answers: list[Answer] = []
        for request, owned in zip(batch, applied, strict=True):
            wants = request.finalize.next_job and claimed
            answers.append((owned, [claimed.pop(0)] if wants else []))
        return answers


def _claim_of(request: _Finalize) -> ClaimFor | None:
    return request.claim


def _check_terminal(outcome: AttemptResult) -> None:
    if not outcome.status.is_terminal:
        raise ValueError(f"finalize needs a terminal status, not {outcome.status}")
