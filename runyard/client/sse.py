"""An incremental server-sent events parser with bounded memory, for the API client."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Far above any event the API sends (a log chunk is a few KiB), low enough to bound memory.
MAX_EVENT_BYTES = 16 * 1024 * 1024
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: its id (the last one seen), type and raw data text."""

    id: str
    type: str
    data: str

    def payload(self) -> dict[str, Any] | None:
        """The data as a JSON object, or None when it is not one."""
        try:
            value = json.loads(self.data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


class SseParser:
    """Feed it bytes as they arrive; it returns the complete events.

    Lines end with CRLF, LF or CR; comments, unknown fields and events without data are
    skipped. An event whose lines would exceed ``max_event_bytes`` is dropped whole and
    counted in ``dropped``, and parsing goes on with the next event.
    """

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buffer = bytearray()
        self._size = 0
        self._discarding = False
        self._type = ""
        self._data: list[str] = []
        self._started = False
        self.last_id = ""
        self.retry_ms: int | None = None
        self.dropped = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Parse ``chunk`` (any slice of the stream); the events it completed."""
        self._buffer += chunk
        events: list[SseEvent] = []
        if not self._started:
            if len(self._buffer) < len(BOM) and BOM.startswith(self._buffer):
                return events
            self._started = True
            if self._buffer.startswith(BOM):
                del self._buffer[: len(BOM)]
        start = 0
        while True:
            end = _line_end(self._buffer, start)
            if end is None:
                break
            line_end, next_start = end
            self._line(bytes(self._buffer[start:line_end]), events)
            start = next_start
        del self._buffer[:start]
        if len(self._buffer) + self._size > self._max:
            # The unfinished line alone is too long: drop what is here (a trailing CR stays,
            # it may end the line), skip the rest of it and of its event.
            self._drop()
            del self._buffer[: len(self._buffer) - self._buffer.endswith(b"\r")]
        return events

    def close(self) -> list[SseEvent]:
        """The stream ended: an unterminated last line counts, an undispatched event does not."""
        events: list[SseEvent] = []
        if self._buffer.endswith(b"\r"):
            self._line(bytes(self._buffer[:-1]), events)
        elif self._buffer:
            self._line(bytes(self._buffer), events)
        self._buffer.clear()
        return events

    def _drop(self) -> None:
        if not self._discarding:
            self.dropped += 1
        self._discarding = True
        self._data = []
        self._type = ""
        self._size = 0

    def _line(self, raw: bytes, events: list[SseEvent]) -> None:
        if not raw:
            if not self._discarding and self._data:
                data = "\n".join(self._data)
                events.append(SseEvent(self.last_id, self._type or "message", data))
            self._discarding = False
            self._data, self._type, self._size = [], "", 0
            return
        if self._discarding:
            return
        self._size += len(raw) + 1
        if self._size > self._max:
            self._drop()
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)


def _line_end(buffer: bytearray, start: int) -> tuple[int, int] | None:
    """Where the line at ``start`` ends and the next begins; None if it is not complete.

    A CR as the last byte waits for the next chunk: it may be the first half of a CRLF.
    """
    lf = buffer.find(b"\n", start)
    cr = buffer.find(b"\r", start, lf if lf >= 0 else len(buffer))
    if cr >= 0:
        if cr + 1 == len(buffer):
            return None
        return cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
    if lf >= 0:
        return lf, lf + 1
    return None
