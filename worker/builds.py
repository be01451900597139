"""The worker's builds: it queues the builds its engine lacks for the runs of its queues,
holds at most one build at a time under a lease of its own, and fails the runs of builds
that failed. Builds take no run slot."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, OperationalError

from runyard.builder import Builder, BuilderUnavailable, BuildResult
from runyard.builds.rules import (
    BuildAction,
    failure_message,
    lost_reason,
    on_claim,
    timeout_reason,
)
from runyard.platform.tracing import Attributes, tracing
from runyard.queue.builds import BuildQueue, ClaimedBuild
from runyard.usage.ledger import Recorded, UsageLedger

logger = logging.getLogger(__name__)

_DB_ERRORS = (OperationalError, DBAPIError)
# Build output is written to the database at most this often (or when this much piled up).
FLUSH_SECONDS = 0.5
FLUSH_CHARS = 8192
LOCAL_TAIL_CHARS = 65_536


@dataclass(frozen=True)
class BuildConfig:
    """What the build agent needs to know."""

    worker_id: str
    queues: tuple[str, ...] = ("default",)
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    # A build given back for engine trouble is due again after this long.
    retry_seconds: float = 5.0
    # Rounds closer together than this are skipped: the claim loop calls one at every wake-up
    # (a notification per submitted run), and a build is still asked for within this long.
    min_round_seconds: float = 0.0
    # While this process hears every job written that waits for a build (``hears_builds``), a
    # round that finds nothing to do lets the next ones skip their probe for this long, unless
    # such a job is written (``wake``). 0: every round probes.
    heard_rest_seconds: float = 0.0


class _LogPipe:
    """Build output to the database in pieces, fenced by the lease; keeps a local tail."""

    def __init__(self, builds: BuildQueue, held: ClaimedBuild) -> None:
        self._builds = builds
        self._held = held
        self._pending: list[str] = []
        self._size = 0
        self._last = time.monotonic()
        self.tail = ""
        self.lost = False

    def write(self, text: str) -> bool:
        """Take a piece of output; False once the lease is gone (the build stops)."""
        self.tail = (self.tail + text)[-LOCAL_TAIL_CHARS:]
        self._pending.append(text)
        self._size += len(text)
        if self._size >= FLUSH_CHARS or time.monotonic() - self._last >= FLUSH_SECONDS:
            self.flush()
        return not self.lost

    def flush(self) -> None:
        """Write what piled up (a database error keeps it for the next flush)."""
        if not self._pending or self.lost:
            return
        text = "".join(self._pending)
        try:
            owned = self._builds.append_log(self._held.build_id, self._held.lease_token, text)
        except _DB_ERRORS as exc:
            logger.warning("build log not written; retrying", extra={"error": str(exc)})
            return
        self._pending, self._size, self._last = [], 0, time.monotonic()
        if not owned:
            self.lost = True


class BuildAgent:
    """Requests, claims and runs this worker's builds (one at a time, on its own thread)."""

    def __init__(
        self,
        builds: BuildQueue,
        builder: Builder,
        config: BuildConfig,
        usage: UsageLedger | None = None,
    ) -> None:
        self._builds = builds
        self._builder = builder
        self._config = config
        # Each build's usage is recorded under its lease before it is ready or failed (None:
        # builds are not metered).
        self._usage = usage
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._on_trouble: Callable[[str], None] = lambda error: None
        self._on_ready: Callable[[], None] = lambda: None
        self._last_round = -math.inf
        self._hearing = False
        self._asked = threading.Event()
        self._rest_until = -math.inf

    def bind(self, on_trouble: Callable[[str], None], on_ready: Callable[[], None]) -> None:
        """What to call when the engine fails a build call, and when a build is ready."""
        self._on_trouble = on_trouble
        self._on_ready = on_ready

    def wake(self) -> None:
        """A job that waits for a build was written: the next round probes (any thread)."""
        self._asked.set()

    def hears_builds(self, hearing: bool) -> None:
        """This process's LISTEN link for build-waiting jobs is up (True) or lost (any
        thread): while it is up, a round that found nothing lets the next ones rest. Either
        way the next round probes, for a job written while the link was down."""
        self._hearing = hearing
        self._asked.set()

    @property
    def busy(self) -> bool:
        """Whether a build is in progress here."""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def run_once(self, engine_id: str, queues: Sequence[str] | None = None) -> bool:
        """One round: queue missing builds, fail runs of failed builds, start a build if
        none runs here; True if one was started."""
        if self._stopping.is_set():
            return False
        now = time.monotonic()
        if now - self._last_round < self._config.min_round_seconds:
            return False
        if now < self._rest_until and not self._asked.is_set():
            return False
        # Cleared before the probe: a job written while it runs asks for the next round.
        self._asked.clear()
        self._last_round = now
        # Most rounds find nothing: one probe instead of the three statements below.
        if not self._builds.pending(engine_id):
            rest = self._config.heard_rest_seconds if self._hearing else 0.0
            self._rest_until = now + rest
            return False
        self._rest_until = -math.inf
        requested = self._builds.request_builds(engine_id, queues or self._config.queues)
        for tag in requested:
            logger.info("build queued", extra={"tag": tag, "engine_id": engine_id})
        self._builds.fail_waiting()
        if self.busy:
            return False
        held = self._builds.claim(
            worker_id=self._config.worker_id,
            engine_id=engine_id,
            lease_seconds=self._config.lease_seconds,
        )
        if held is None:
            return False
        thread = threading.Thread(
            target=self._execute, args=(held,), name="runyard-build", daemon=True
        )
        with self._lock:
            self._thread = thread
        thread.start()
        return True

    def stop(self, timeout: float | None = None) -> None:
        """Stop: a build in progress is cut and given back, due again at once."""
        self._stopping.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no build runs here; False on timeout."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _log(self, held: ClaimedBuild, **more: object) -> dict[str, object]:
        return {
            "build_id": str(held.build_id),
            "tag": held.request.tag,
            "attempt": held.attempt,
            "worker_id": self._config.worker_id,
            **more,
        }

    def _execute(self, held: ClaimedBuild) -> None:
        """Decide, build, record (a ``build`` span when tracing is on); nothing escapes the
        thread."""
        attributes: Attributes = {
            "runyard.build.tag": held.request.tag,
            "runyard.build.id": str(held.build_id),
            "runyard.build.attempt": held.attempt,
            "runyard.worker_id": self._config.worker_id,
        }
        with tracing().span("build", attributes=attributes):
            self._held(held)

    def _held(self, held: ClaimedBuild) -> None:
        try:
            self._decide(held)
        except BuilderUnavailable as exc:
            logger.warning(
                "engine failed the build; given back", extra=self._log(held, error=str(exc))
            )
            self._give_back(held, self._config.retry_seconds)
            self._on_trouble(str(exc))
        except Exception:
            logger.exception("build crashed in the worker; given back", extra=self._log(held))
            self._give_back(held, self._config.retry_seconds)

    def _give_back(self, held: ClaimedBuild, delay: float) -> None:
        try:
            self._builds.release(held.build_id, held.lease_token, delay=delay)
        except _DB_ERRORS as exc:
            logger.warning(
                "build release failed; its lease runs out", extra=self._log(held, error=str(exc))
            )

    def _decide(self, held: ClaimedBuild) -> None:
        tag = held.request.tag
        image = self._builder.image_id(tag)
        action = on_claim(
            image_present=image is not None,
            recovered=held.recovered,
            attempts=held.attempt,
            max_attempts=held.max_attempts,
        )
        if action is BuildAction.ADOPT:
            assert image is not None
            logger.info("build adopted: the engine has the image", extra=self._log(held))
            # A build taken over from a dead worker was built (its steps' figures are in
            # its parent cgroup); one whose image was simply there was not.
            if self._metered(held, built=held.recovered):
                self._ready(held, image)
            return
        if action is BuildAction.GIVE_UP:
            message = failure_message(tag, lost_reason(held.attempt), "")
            if self._metered(held, built=True):
                self._builds.failed(held.build_id, held.lease_token, message)
                self._builder.forget_usage(held.request.meter_name)
            return
        self._build(held)

    def _metered(self, held: ClaimedBuild, *, built: bool) -> bool:
        """Record what the build consumed (once, under its lease, charged to the oldest run
        waiting for it); False when the lease is gone. Not ``built`` here and nothing
        measured: nothing to record."""
        if self._usage is None:
            return True
        usage = self._builder.usage(held.request.meter_name)
        if not built and usage.cpu_seconds is None:
            return True
        recorded = self._usage.record_build(held.build_id, held.lease_token, usage)
        if recorded is Recorded.LEASE_LOST:
            logger.warning("build lease lost before its usage", extra=self._log(held))
            return False
        return True

    def _ready(self, held: ClaimedBuild, image: str) -> None:
        """Record the image (and this build's span for the waits that link to it)."""
        trace = tracing().current()
        traceparent = trace.traceparent if trace is not None else None
        if self._builds.ready(held.build_id, held.lease_token, image, traceparent=traceparent):
            logger.info("build ready", extra=self._log(held, image_id=image))
            self._on_ready()
        self._builder.forget_usage(held.request.meter_name)

    def _build(self, held: ClaimedBuild) -> None:
        logger.info("build started", extra=self._log(held, recovered=held.recovered))
        pipe = _LogPipe(self._builds, held)
        stop = threading.Event()
        renewals = threading.Thread(
            target=self._renew, args=(held, stop, pipe), name="runyard-build-lease", daemon=True
        )
        renewals.start()
        watcher = threading.Thread(target=self._watch_stop, args=(stop,), daemon=True)
        watcher.start()
        try:
            result = self._builder.build(held.request, pipe.write, stop)
        finally:
            stop.set()
            renewals.join()
        pipe.flush()
        if pipe.lost:
            logger.warning("build lease lost; left to its next holder", extra=self._log(held))
            return
        if self._stopping.is_set() and not result.ok:
            self._give_back(held, 0.0)
            return
        self._record(held, result, pipe.tail)

    def _record(self, held: ClaimedBuild, result: BuildResult, log: str) -> None:
        tag = held.request.tag
        if not self._metered(held, built=True):
            return
        if result.ok:
            assert result.image_id is not None
            self._ready(held, result.image_id)
            return
        reason = (
            timeout_reason(int(held.request.timeout_seconds))
            if result.timed_out
            else str(result.error)
        )
        owned, failed_runs = self._builds.failed(
            held.build_id, held.lease_token, failure_message(tag, reason, log)
        )
        self._builder.forget_usage(held.request.meter_name)
        logger.warning(
            "build failed",
            extra=self._log(held, error=reason, owned=owned, failed_runs=failed_runs),
        )

    def _watch_stop(self, stop: threading.Event) -> None:
        """Cut the build when the worker stops."""
        while not stop.is_set():
            if self._stopping.wait(0.2):
                stop.set()

    def _renew(self, held: ClaimedBuild, stop: threading.Event, pipe: _LogPipe) -> None:
        """Renew the build's lease until it ends; a lease taken away stops the build."""
        valid_until = time.monotonic() + self._config.lease_seconds
        while not stop.wait(self._config.heartbeat_seconds):
            try:
                owned = self._builds.heartbeat(
                    held.build_id, held.lease_token, lease_seconds=self._config.lease_seconds
                )
            except _DB_ERRORS as exc:
                logger.warning("build heartbeat failed", extra=self._log(held, error=str(exc)))
                if time.monotonic() >= valid_until:
                    pipe.lost = True
                    stop.set()
                continue
            if not owned:
                pipe.lost = True
                stop.set()
                return
            valid_until = time.monotonic() + self._config.lease_seconds
