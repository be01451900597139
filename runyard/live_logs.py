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

from runyard.capture import to_text
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

    def __init__(self, container: Any, stream: str, sink: LogSink, cap_bytes: int) -> None:
        self._container = container
        self._stream = stream
        self._sink = sink
        self._cap = cap_bytes
        self._handle: Any = None
        self._stopped = threading.Event()
        self.sent_bytes = 0
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
        pending: list[bytes] = []
        pending_size = 0
        last_stamp = ""
        last_flush = time.monotonic()
        remainder = b""
        for chunk in self._handle:
            if self._stopped.is_set():
                return
            data = remainder + chunk
            lines = data.split(b"\n")
            remainder = lines.pop()
            for line in lines:
                stamp, _, payload = line.partition(b" ")
                stamp_text = stamp.decode("ascii", errors="replace")
                if after is not None and timestamp_key(stamp_text) <= after:
                    continue
                pending.append(payload + b"\n")
                pending_size += len(payload) + 1
                last_stamp = stamp_text
            now = time.monotonic()
            if pending and (pending_size >= FLUSH_BYTES or now - last_flush >= FLUSH_SECONDS):
                if not self._flush(pending, last_stamp):
                    return
                pending, pending_size, last_flush = [], 0, now
        if remainder:
            stamp, _, payload = remainder.partition(b" ")
            stamp_text = stamp.decode("ascii", errors="replace")
            if after is None or timestamp_key(stamp_text) > after:
                pending.append(payload)
                last_stamp = stamp_text
        if pending:
            self._flush(pending, last_stamp)

    def _flush(self, pending: list[bytes], until: str) -> bool:
        data = b"".join(pending)
        if self.sent_bytes + len(data) > self._cap:
            data = data[: max(0, self._cap - self.sent_bytes)]
            text = to_text(data) + "\n[live log truncated; the stored log keeps head and tail]\n"
            self._sink.write(self._stream, text, until)
            self.sent_bytes = self._cap
            return False
        self.sent_bytes += len(data)
        return self._sink.write(self._stream, to_text(data), until)
