"""An attempt in flight under its owner, the log sink fenced by that ownership, and the
database clock as the owner's renewals measure it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from runyard.attempts.held import Held
from runyard.queue import ClaimedJob
from runyard.reads.metrics import Metrics
from runyard.runner import LogSink


@dataclass
class Flight(Held):
    """A job a slot holds, with what its owner keeps of it."""

    # The job this slot's finalize claimed, to run next in the same thread.
    next_job: ClaimedJob | None = None
    # How often the runner asked before touching the engine: once before the create, again
    # before the start. At most once means the tool never started (see ``release``).
    engine_asks: int = 0
    # The database confirmed the lease by a fenced write just now (the start's record): the
    # next engine ask takes that answer instead of asking again.
    lease_confirmed: bool = False
    # The committed finalize also asked for the slot's next job: with none back, nothing was
    # there to claim then (the holder's claim loop need not look again at once).
    asked_next: bool = False


def counting(flight: Flight, ask: Callable[[], bool]) -> Callable[[], bool]:
    """``ask``, counting its calls in ``flight.engine_asks``."""

    def still_owner() -> bool:
        flight.engine_asks += 1
        return ask()

    return still_owner


def log_fields(job: ClaimedJob, owner_id: str, **more: object) -> dict[str, object]:
    """The structured fields of a log line about ``job``'s attempt under ``owner_id``."""
    return {"run_id": str(job.run_id), "attempt": job.attempt, "worker_id": owner_id, **more}


class FencedLogSink:
    """A log sink that stops the stream as soon as this process is no longer the owner."""

    def __init__(self, sink: LogSink, owns: Callable[[], bool]) -> None:
        self._sink = sink
        self._owns = owns

    def resume_point(self, stream: str) -> str | None:
        """Where the previous owner of this attempt stopped, if anywhere."""
        return self._sink.resume_point(stream)

    def write(self, stream: str, text: str, until: str) -> bool:
        """Append a chunk while we own the attempt; False (stop sending) once we do not."""
        return self._owns() and self._sink.write(stream, text, until)


class LeaseClock:
    """The database's clock, as statements that return its ``now()`` measure it."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        # Database clock minus ours (seconds); None until measured.
        self.offset: float | None = None

    def sample(self, asked: datetime, db_now: datetime) -> None:
        """Learn the offset from a statement sent at ``asked`` that returned ``db_now``."""
        answered = datetime.now(UTC)
        self.offset = (db_now - (asked + (answered - asked) / 2)).total_seconds()
        self._metrics.db_clock_offset.set(self.offset)

    def now(self) -> datetime:
        """Now on the database's clock (ours until measured)."""
        return datetime.now(UTC) + timedelta(seconds=self.offset or 0.0)
