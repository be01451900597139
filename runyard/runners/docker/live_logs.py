"""Follow a running container's log and hand it to a ``LogSink`` in chunks, resumably.

Each chunk carries the engine timestamp of its last line. An adopter asks the sink where the
previous owner stopped, follows from that second, and skips lines at or before that
timestamp, so no line is lost or repeated across a change of owner.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from runyard.platform.capture import HeadTailBuffer, to_text
from runyard.registry.redact import Redactor
from runyard.runner import LogSink

logger = logging.getLogger(__name__)

FLUSH_BYTES = 32 * 1024
FLUSH_SECONDS = 0.25


def timestamp_key(stamp: str) -> tuple[str, int]:
    """Order RFC 3339 timestamps with nanoseconds (Docker trims trailing zeros)."""
    main, _, frac = stamp.rstrip("Z").partition(".")
    return main, int((frac + "000000000")[:9] or 0)


def _since_seconds(stamp: str) -> int:
    main, _ = timestamp_key(stamp)
    return int(datetime.fromisoformat(main + "+00:00").timestamp())


class LogFollower:
    """One thread per stream; stops at container exit, on ``stop()``, or at the byte cap."""

    def __init__(
        self,
        container: Any,
        stream: str,
        sink: LogSink,
        cap_bytes: int,
        redactor: Redactor | None = None,
    ) -> None:
        self._container = container
        self._stream = stream
        self._sink = sink
        self._cap = cap_bytes
        self._redactor = redactor or Redactor(())
        self._handle: Any = None
        self._stopped = threading.Event()
        self.sent_bytes = 0
        # Entries read but not yet written, with their stamps: flushed by size, by the next
        # chunk after the flush interval, or by a timer, so a quiet container's last line
        # never waits for another. Entries that may hold the start of a secret stay until
        # the next entry (or the end) shows whether they do.
        self._lock = threading.Lock()
        self._pending: list[tuple[bytes, str]] = []
        self._pending_size = 0
        self._last_flush = 0.0
        self._timer: threading.Timer | None = None
        self._finished = False
        self._thread = threading.Thread(
            target=self._run, name=f"runyard-logs-{stream}", daemon=True
        )

    def start(self) -> None:
        """Begin following in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop following now (closes the engine's stream)."""
        self._stopped.set()
        self._close(interrupt=True)

    def _close(self, *, interrupt: bool) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            if interrupt:
                # Shuts the socket down under a reader blocked in another thread.
                handle.close()
            # Releasing the response also drops the file object that wraps the socket, so
            # nothing is left for the garbage collector to find unclosed.
            handle._response.close()
        except Exception:
            logger.debug("closing the log stream failed", exc_info=True)

    def join(self, timeout: float) -> None:
        """Wait for the thread to finish the stream."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.stop()
            self._thread.join(1.0)

    def _run(self) -> None:
        try:
            self._follow()
        except Exception:
            if not self._stopped.is_set():
                logger.warning("live log follow ended early", exc_info=True)
        finally:
            self._close(interrupt=False)

    def _follow(self) -> None:
        resume = self._sink.resume_point(self._stream)
        kwargs: dict[str, Any] = {
            "stdout": self._stream == "stdout",
            "stderr": self._stream == "stderr",
            "stream": True,
            "follow": True,
            "timestamps": True,
        }
        if resume is not None:
            kwargs["since"] = _since_seconds(resume)
        after = timestamp_key(resume) if resume is not None else None
        self._handle = self._container.logs(**kwargs)
        try:
            # One frame is one log entry: "<engine timestamp> <payload>", the payload a line
            # or, for output without newlines, a piece of at most 16 KiB. Reading by entry,
            # never joining pieces into lines, keeps memory at one flush whatever is printed.
            for entry in self._handle:
                if self._stopped.is_set():
                    return
                stamp, _, payload = entry.partition(b" ")
                stamp_text = stamp.decode("ascii", errors="replace")
                if after is not None and timestamp_key(stamp_text) <= after:
                    continue
                with self._lock:
                    self._add(payload, stamp_text)
                    if not self._flush_due():
                        return
            with self._lock:
                if self._pending:
                    self._flush_pending(final=True)
        finally:
            with self._lock:
                self._finished = True
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None

    def _add(self, data: bytes, stamp: str) -> None:
        self._pending.append((data, stamp))
        self._pending_size += len(data)

    def _flush_due(self) -> bool:
        """Flush now if enough is pending or it is time, else make sure a timer will;
        False when the sink refused (the lease is gone) or the cap is reached."""
        if not self._pending:
            return True
        since = time.monotonic() - self._last_flush
        if self._pending_size >= FLUSH_BYTES or since >= FLUSH_SECONDS:
            return self._flush_pending()
        if self._timer is None:
            self._timer = threading.Timer(FLUSH_SECONDS - since, self._flush_later)
            self._timer.daemon = True
            self._timer.start()
        return True

    def _flush_later(self) -> None:
        with self._lock:
            self._timer = None
            if self._finished or self._stopped.is_set() or not self._pending:
                return
            try:
                accepted = self._flush_pending()
            except Exception:
                logger.warning("live log flush failed", exc_info=True)
                accepted = False
        if not accepted:
            self.stop()

    def _flush_pending(self, *, final: bool = False) -> bool:
        pending = self._pending
        self._last_flush = time.monotonic()
        data = b"".join(payload for payload, _ in pending)
        count = len(pending)
        if self._redactor.active and not final:
            # Held back by whole entries: a chunk's stamp stays that of its last entry, so
            # an adopter that resumes after it repeats nothing and skips nothing.
            starts, offset = [], 0
            for payload, _ in pending:
                starts.append(offset)
                offset += len(payload)
            cut = self._redactor.safe_cut(data, starts)
            count = starts.index(cut) if cut < len(data) else count
            data = data[:cut]
        self._pending = pending[count:]
        self._pending_size = sum(len(payload) for payload, _ in self._pending)
        if count == 0:
            return True
        return self._flush(self._redactor.mask(data), pending[count - 1][1])

    def _flush(self, data: bytes, until: str) -> bool:
        if self.sent_bytes + len(data) > self._cap:
            data = data[: max(0, self._cap - self.sent_bytes)]
            text = to_text(data) + "\n[live log truncated; the stored log keeps head and tail]\n"
            self._sink.write(self._stream, text, until)
            self.sent_bytes = self._cap
            return False
        self.sent_bytes += len(data)
        return self._sink.write(self._stream, to_text(data), until)


class AttemptLogs:
    """The live log followers of one attempt, started on demand (or never, for quick runs)."""

    def __init__(self, source: Any, sink: LogSink | None, cap: int, redactor: Redactor) -> None:
        self._source = source
        self._sink = sink
        self._cap = cap
        # The tool's secret values: masked in every chunk and in the stored outputs.
        self.redactor = redactor
        self._followers: list[LogFollower] = []
        self.started = sink is None  # nothing to stream: never start

    def start(self) -> None:
        """Follow both streams from where the sink says the last owner stopped."""
        if self.started or self._sink is None:
            return
        self.started = True
        self._followers = [
            LogFollower(self._source, stream, self._sink, self._cap, self.redactor)
            for stream in ("stdout", "stderr")
        ]
        for follower in self._followers:
            follower.start()

    def stop(self) -> None:
        """Stop following now."""
        for follower in self._followers:
            follower.stop()

    def join(self) -> None:
        """Let the followers drain the ended streams."""
        for follower in self._followers:
            follower.join(timeout=5.0)

    def replay(self, stdout: HeadTailBuffer, stderr: HeadTailBuffer, finished_at: str) -> None:
        """The whole (capped) log of an attempt that ended before anyone followed it.

        Only the runner that started the container calls it, so no chunk of this attempt
        exists yet. One chunk per stream, stamped no earlier than the latest line's timestamp:
        an adopter after us resumes past all of them (no repeat), and one before this point
        finds no chunk and follows from the start (no loss).
        """
        if self._sink is None:
            return
        for stream, buffer in (("stdout", stdout), ("stderr", stderr)):
            if not buffer.total:
                continue
            try:
                self._sink.write(stream, buffer.text(), finished_at)
            except Exception:
                # As for a follower: live chunks are a courtesy, the stored log is the record.
                logger.warning("could not send the log of a quick attempt", exc_info=True)
