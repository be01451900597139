"""An exec session: one long-lived ``sh`` loop per sandbox that starts, polls, reads and kills
commands for its owner, so each of those is a line written and an answer read on an open
stream instead of a process the engine starts in the container.

The loop (``SESSION``) reads one request a line from its stdin and answers each on its stdout,
framed with the request's nonce; a read's bytes are counted before they are sent and followed
by a trailer. The commands never write to the session: their output goes to their files under
the wrapper (``EXEC_WRAPPER``), which only tells the session's stderr that a command exited, a
wake-up and nothing more. Whatever does not parse (a garbled answer, a wrong nonce, more bytes
than asked, an answer too slow) breaks the session: its caller makes the call the old way (one
engine exec) and opens a new session later. Nothing is lost or stored twice by that, because
the bytes are stored by offset (``APPEND_CHUNK``) and a command's ``mkdir`` is its start.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

from runyard.domain.sandboxes import EXECS_DIR
from runyard.sandbox_engine import ExecFiles, parse_poll

# sh -c SESSION runyard-session <EXEC_WRAPPER>. Requests, one a line, words split on spaces:
#   p NONCE EXEC                    -> "NONCE p <EXEC_POLL's answer>"
#   r NONCE EXEC STREAM OFFSET SIZE -> "NONCE r COUNT", COUNT bytes, "NONCE e"
#   s NONCE EXEC NENV ENV... CWD ARG... (each word encoded by encode_word) -> "NONCE s"
#   k NONCE EXEC                    -> "NONCE k"
# A read's bytes go through a file of the session's own, so their count is known before
# they are sent. Every file read here is one the sandbox's user could change, so nothing
# read is trusted beyond its parsing.
SESSION = (
    f'w="$1"; d="{EXECS_DIR}"; t="$d/.session-$$"\n'
    "trap 'rm -f \"$t\"' EXIT\n"
    "set -f\n"
    "dec() { case $1 in *\\\\*) v=$(printf '%b.' \"${1#w}\"); v=${v%.} ;; *) v=${1#w} ;; esac; }\n"
    "while IFS= read -r line; do\n"
    "  set -- $line; [ $# -ge 3 ] || { echo '? ?'; continue; }\n"
    '  op=$1; n=$2; e="$d/$3"; shift 2\n'
    "  case $op in\n"
    "  p)\n"
    '    if [ -d "$e" ]; then\n'
    '      x=-; [ -f "$e/exit" ] && read -r x 2>/dev/null <"$e/exit"\n'
    '      o=$(wc -c 2>/dev/null <"$e/stdout"); r=$(wc -c 2>/dev/null <"$e/stderr")\n'
    '      echo "$n p ${x:--} ${o:-0} ${r:-0}"\n'
    '    else echo "$n p missing"; fi ;;\n'
    "  r)\n"
    '    tail -c +$(($3 + 1)) "$e/$2" 2>/dev/null | head -c "$4" >"$t"\n'
    # Emptied once sent: a session killed later leaves no copy of the bytes behind.
    '    c=$(wc -c <"$t"); echo "$n r $c"; head -c "$c" "$t"; : >"$t"; echo "$n e" ;;\n'
    "  s)\n"
    "    id=$1; k=$2; shift 2\n"
    '    ( while [ "$k" -gt 0 ]; do dec "$1"; export "$v"; shift; k=$((k - 1)); done\n'
    '      dec "$1"; cwd=$v; shift\n'
    '      m=$#; while [ "$m" -gt 0 ]; do dec "$1"; set -- "$@" "$v"; shift; m=$((m - 1)); done\n'
    '      sh -c "$w" runyard-exec "$id" "$cwd" "$@" </dev/null >/dev/null & )\n'
    '    echo "$n s" ;;\n'
    "  k)\n"
    # Just started, the wrapper may not have noted the pid yet: wait for it (up to 1 s).
    '    i=0; while [ ! -s "$e/pid" ] && [ ! -f "$e/exit" ] && [ $i -lt 20 ]; do\n'
    "      sleep 0.05; i=$((i + 1)); done\n"
    '    p=; read -r p 2>/dev/null <"$e/pid"; kill -KILL "$p" 2>/dev/null; echo "$n k" ;;\n'
    '  *) echo "$n ?" ;;\n'
    "  esac\n"
    "done\n"
)

# An answer's line is short; a read's bytes are at most what was asked. Past these the
# session is broken, so a flood on its stdout never grows the owner's memory.
MAX_LINE = 256
SLACK_BYTES = 65_536
ANSWER_SECONDS = 10.0
# Bytes that stay as they are in an encoded word; every other byte becomes \0ooo.
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.,:/=+@%-")


class SessionBroken(Exception):
    """The session gave no answer, or one that does not parse; it is closed."""


def encode_word(value: str) -> str:
    """``value`` as one word of a request line (no space, no newline, no glob), which the
    session decodes with ``printf %b``; the leading ``w`` keeps an empty value a word."""
    return "w" + "".join(
        chr(b) if b in _PLAIN else f"\\0{b:03o}" for b in value.encode("utf-8", "surrogateescape")
    )


def decode_word(word: str) -> str:
    """What ``encode_word`` encoded (as the session's ``printf %b`` decodes it)."""
    raw, body, at = bytearray(), word.removeprefix("w").encode("ascii"), 0
    while at < len(body):
        if body[at : at + 2] == b"\\0" and body[at + 2 : at + 5].isdigit():
            raw.append(int(body[at + 2 : at + 5], 8))
            at += 5
        else:
            raw.append(body[at])
            at += 1
    return raw.decode("utf-8", "surrogateescape")


def start_words(exec_id: uuid.UUID, command: list[str], env: dict[str, str], cwd: str) -> list[str]:
    """The words of a start request after its nonce."""
    pairs = [encode_word(f"{name}={value}") for name, value in env.items()]
    return [str(exec_id), str(len(pairs)), *pairs, encode_word(cwd), *map(encode_word, command)]


class SessionTransport(Protocol):
    """The stream a session client writes its requests to (its answers are fed to it)."""

    def send(self, data: bytes) -> None:
        """Write bytes to the session's stdin."""
        ...

    def close(self) -> None:
        """Hang up: the session's loop reads the end of its stdin and stops."""
        ...


class ExecSession(Protocol):
    """Commands of one sandbox over an open session. Every call raises ``SessionBroken`` when
    the session cannot answer it (the session is then closed for good)."""

    def start(
        self, exec_id: uuid.UUID, command: list[str], *, env: dict[str, str], cwd: str
    ) -> None:
        """Start the command under the wrapper (its stdin, if any, already in place)."""
        ...

    def poll(self, exec_id: uuid.UUID) -> ExecFiles:
        """What the container holds of the command."""
        ...

    def read(self, exec_id: uuid.UUID, stream: str, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of the command's ``stream`` from ``offset``."""
        ...

    def kill(self, exec_id: uuid.UUID) -> None:
        """SIGKILL the command."""
        ...

    def close(self) -> None:
        """End the session (the commands it started run on)."""
        ...


class SessionClient:
    """The owner's end of a session: one request at a time, each answer checked.

    Its transport's reader feeds it what the session writes (``feed_stdout``,
    ``feed_stderr``, ``feed_end``); a line on the session's stderr is a command's exit
    notice, which only calls ``wake``.
    """

    def __init__(
        self,
        transport: SessionTransport,
        *,
        wake: Callable[[], None] = lambda: None,
        answer_seconds: float = ANSWER_SECONDS,
    ) -> None:
        self._transport = transport
        self._wake = wake
        self._answer_seconds = answer_seconds
        self._request_lock = threading.Lock()
        self._ready = threading.Condition()
        self._buffer = bytearray()
        self._limit = MAX_LINE
        self._closed = False

    # --- what the transport's reader feeds ---

    def feed_stdout(self, data: bytes) -> None:
        """Bytes the session wrote to its stdout; beyond what an answer may hold, the
        session is broken (no growth without bound)."""
        with self._ready:
            if len(self._buffer) + len(data) > self._limit + SLACK_BYTES:
                self._closed = True
            else:
                self._buffer += data
            self._ready.notify_all()

    def feed_stderr(self, data: bytes) -> None:
        """Bytes of the session's stderr: a finished line wakes the owner's round."""
        if b"\n" in data:
            self._wake()

    def feed_end(self) -> None:
        """The session's streams ended."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    # --- the requests ---

    def start(
        self, exec_id: uuid.UUID, command: list[str], *, env: dict[str, str], cwd: str
    ) -> None:
        """Start the command; the session answers once it launched the wrapper."""
        with self._exchange():
            nonce = self._send("s", start_words(exec_id, command, env, cwd))
            self._expect(nonce, "s")

    def poll(self, exec_id: uuid.UUID) -> ExecFiles:
        """The command's exit and output sizes (a garbled one: nothing new)."""
        with self._exchange():
            nonce = self._send("p", [str(exec_id)])
            return parse_poll(self._expect(nonce, "p"))

    def read(self, exec_id: uuid.UUID, stream: str, offset: int, size: int) -> bytes:
        """Bytes of one output file; only a whole, well-framed answer counts."""
        if stream not in ("stdout", "stderr") or offset < 0 or size < 0:
            raise ValueError(f"not a read of an output stream: {stream} {offset} {size}")
        with self._exchange():
            nonce = self._send("r", [str(exec_id), stream, str(offset), str(size)], size)
            count = self._expect(nonce, "r")
            if not count.isdigit() or int(count) > size:
                raise SessionBroken(f"a read announced {count[:20]!r} bytes of {size}")
            data = self._take(int(count))
            self._expect(nonce, "e")
            return data

    def kill(self, exec_id: uuid.UUID) -> None:
        """SIGKILL the command's process."""
        with self._exchange():
            nonce = self._send("k", [str(exec_id)])
            self._expect(nonce, "k")

    def close(self) -> None:
        """Hang up; every later request raises ``SessionBroken``."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        self._transport.close()

    @property
    def closed(self) -> bool:
        """Whether the session ended or was found broken."""
        return self._closed

    # --- framing ---

    @contextlib.contextmanager
    def _exchange(self) -> Iterator[None]:
        """One request and its answer; any trouble closes the session for good."""
        with self._request_lock:
            try:
                yield
            except SessionBroken:
                self.close()
                raise
            finally:
                with self._ready:
                    self._limit = MAX_LINE

    def _send(self, op: str, words: list[str], expect_bytes: int = 0) -> str:
        nonce = secrets.token_hex(8)
        with self._ready:
            if self._closed:
                raise SessionBroken("the session is closed")
            if self._buffer:  # nobody asked for these bytes: someone else writes here
                raise SessionBroken("bytes came without a request")
            self._limit = expect_bytes + 2 * MAX_LINE
        try:
            self._transport.send(f"{op} {nonce} {' '.join(words)}\n".encode("ascii"))
        except OSError as exc:
            raise SessionBroken(f"cannot write to the session: {exc}") from exc
        return nonce

    def _expect(self, nonce: str, op: str) -> str:
        """The rest of the answer line to ``nonce``'s ``op``."""
        line = self._line()
        head, _, rest = line.partition(f" {op}")
        if head != nonce or (rest and not rest.startswith(" ")):
            raise SessionBroken(f"an answer out of place: {line[:60]!r}")
        return rest.strip()

    def _line(self) -> str:
        deadline = time.monotonic() + self._answer_seconds
        with self._ready:
            while True:
                end = self._buffer.find(b"\n", 0, MAX_LINE + 1)
                if end >= 0:
                    line = bytes(self._buffer[:end])
                    del self._buffer[: end + 1]
                    return line.decode("ascii", "replace")
                self._wait(deadline, len(self._buffer) > MAX_LINE, "answer line")

    def _take(self, count: int) -> bytes:
        deadline = time.monotonic() + self._answer_seconds
        with self._ready:
            while len(self._buffer) < count:
                self._wait(deadline, False, f"{count} bytes")
            data = bytes(self._buffer[:count])
            del self._buffer[:count]
            return data

    def _wait(self, deadline: float, garbled: bool, what: str) -> None:
        """Wait for more bytes (holding ``_ready``); broken if there will be none in time."""
        left = deadline - time.monotonic()
        if garbled or self._closed or left <= 0:
            raise SessionBroken(f"no {what} from the session")
        self._ready.wait(left)
