"""The sandbox engine port: commands and files inside a running sandbox's container.

Every command runs under ``EXEC_WRAPPER``, a small ``sh`` script that captures its stdout,
stderr and exit status in files of a private directory of the container; so its output
never depends on the process that started it, and whoever owns the sandbox next reads on
from the stored offsets. ``mkdir`` of the command's directory is its start: a second start
of the same command (an adopter unsure whether the last owner started it) does nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from runyard.domain.sandboxes import EXECS_DIR, WORKSPACE

if TYPE_CHECKING:
    from runyard.sandbox_session import ExecSession

# The sandbox's main process: makes the workspace, then waits until it is stopped.
KEEPER = (
    f"mkdir -p {WORKSPACE} {EXECS_DIR} && chmod 700 {EXECS_DIR} || exit 1\n"
    "trap 'exit 0' TERM INT\n"
    "while :; do sleep 1 & wait $!; done\n"
)

# sh -c EXEC_WRAPPER runyard-exec <exec id> <cwd> <command...>
EXEC_WRAPPER = (
    f'd="{EXECS_DIR}/$1"; cwd="$2"; shift 2\n'
    f'mkdir -p "{EXECS_DIR}" 2>/dev/null\n'
    'mkdir "$d" 2>/dev/null || exit 0\n'
    'in=/dev/null; [ -f "$d.stdin" ] && in="$d.stdin"\n'
    '( cd "$cwd" 2>/dev/null || { echo "runyard: cannot enter $cwd" >&2; exit 126; }; '
    'exec "$@" ) <"$in" >"$d/stdout" 2>"$d/stderr" &\n'
    'echo $! >"$d/pid"\n'
    "wait $!\n"
    'echo $? >"$d/exit.tmp" && mv "$d/exit.tmp" "$d/exit"\n'
    # A session that started it is told (only a wake-up; the exit file is the fact).
    'echo "x ${d##*/}" >&2\n'
)

# sh -c EXEC_POLL runyard-poll <exec id>: "<exit or -> <stdout bytes> <stderr bytes>", or
# "missing" if the command never started. The exit is read first: once it is there, the
# sizes read after it are final.
EXEC_POLL = (
    f'd="{EXECS_DIR}/$1"\n'
    '[ -d "$d" ] || { echo missing; exit 0; }\n'
    'x=$(cat "$d/exit" 2>/dev/null) || x=-\n'
    'o=$(wc -c <"$d/stdout" 2>/dev/null) || o=0\n'
    'e=$(wc -c <"$d/stderr" 2>/dev/null) || e=0\n'
    'echo "${x:--}" $o $e\n'
)

# sh -c EXEC_READ runyard-read <exec id> <stream> <offset> <bytes>
EXEC_READ = f'tail -c +$(($3 + 1)) "{EXECS_DIR}/$1/$2" 2>/dev/null | head -c "$4"\n'

# sh -c EXEC_KILL runyard-kill <exec id>
EXEC_KILL = f'kill -KILL "$(cat "{EXECS_DIR}/$1/pid")" 2>/dev/null; exit 0\n'


# sh -c EXEC_NO_LINKS runyard-check <path under the workspace>: "ok" unless a component of
# the path is a symbolic link (a file sent or read there would land elsewhere).
EXEC_NO_LINKS = (
    f'p="{WORKSPACE}"; rest="$1"\n'
    'while [ -n "$rest" ]; do\n'
    '  part="${rest%%/*}"; [ "$part" = "$rest" ] && rest="" || rest="${rest#*/}"\n'
    '  p="$p/$part"; [ -L "$p" ] && { echo link; exit 0; }\n'
    "done\n"
    "echo ok\n"
)


# sh -c TERMINAL_WRAPPER runyard-term <terminal id> <command...>: notes its pid (for signals
# other than the TTY's Ctrl-C), then becomes the command.
TERMINAL_WRAPPER = (
    f'mkdir -p "{EXECS_DIR}" 2>/dev/null; echo $$ >"{EXECS_DIR}/term-$1.pid"; shift\nexec "$@"\n'
)
# sh -c TERMINAL_SIGNAL runyard-signal <terminal id> <signal name>
TERMINAL_SIGNAL = f'kill -"$2" "$(cat "{EXECS_DIR}/term-$1.pid")" 2>/dev/null; exit 0\n'
TERMINAL_SIGNALS = frozenset({"INT", "TERM", "KILL", "HUP", "QUIT"})


class SandboxNotRunning(Exception):
    """The sandbox's container is not running (not started yet, or stopped)."""


@dataclass(frozen=True)
class ExecFiles:
    """What the container holds of one command: whether it started, its exit, its sizes."""

    started: bool
    exit_code: int | None = None
    stdout_size: int = 0
    stderr_size: int = 0

    def size(self, stream: str) -> int:
        """The bytes the command wrote to ``stream`` so far."""
        return self.stdout_size if stream == "stdout" else self.stderr_size


def parse_poll(output: str) -> ExecFiles:
    """``EXEC_POLL``'s answer; a garbled one (the command's own doing) counts as not
    finished, with nothing new to read."""
    words = output.split()
    if words == ["missing"]:
        return ExecFiles(started=False)
    if len(words) != 3 or not all(w.isdigit() for w in words[1:]):
        return ExecFiles(started=True)
    code = int(words[0]) if words[0].isdigit() else None
    return ExecFiles(True, code, int(words[1]), int(words[2]))


class SandboxEngine(Protocol):
    """Commands inside a sandbox's container (``container`` is its name). Each call raises
    ``SandboxNotRunning`` when the container is not running, ``RunnerUnavailable`` when the
    engine does not answer."""

    def start_exec(
        self,
        container: str,
        exec_id: uuid.UUID,
        command: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bytes | None,
        user: str,
    ) -> None:
        """Start the command under ``EXEC_WRAPPER`` and return at once (it runs on)."""
        ...

    def ready(self, container: str) -> bool:
        """Whether the keeper has made the workspace (the container runs)."""
        ...

    def open_session(self, container: str, wake: Callable[[], None]) -> ExecSession:
        """A session in the container (``runyard.sandbox_session``); ``wake`` is called
        when a command it started exits."""
        ...

    def put_stdin(self, container: str, exec_id: uuid.UUID, stdin: bytes, user: str) -> None:
        """Put a command's stdin where the wrapper reads it, before it starts."""
        ...

    def poll_exec(self, container: str, exec_id: uuid.UUID) -> ExecFiles:
        """What the container holds of the command."""
        ...

    def read_exec(
        self, container: str, exec_id: uuid.UUID, stream: str, offset: int, size: int
    ) -> bytes:
        """Up to ``size`` bytes of the command's ``stream`` from ``offset``."""
        ...

    def kill_exec(self, container: str, exec_id: uuid.UUID) -> None:
        """SIGKILL the command (its exit status is still written)."""
        ...

    def secret_values(self, container: str, names: list[str]) -> list[str]:
        """The values the container has for the tool's secrets (to mask them)."""
        ...


class SandboxFileEngine(Protocol):
    """Files of a running sandbox, moved as tar streams (the engine's archive API)."""

    def engine_id(self) -> str:
        """The engine's id (its marker), to tell whether a sandbox runs on it."""
        ...

    def has_link(self, container: str, path: str) -> bool:
        """Whether a component of ``path`` (under the workspace) is a symbolic link."""
        ...

    def put_archive(self, container: str, directory: str, data: Iterator[bytes]) -> None:
        """Unpack a tar stream into ``directory`` of the container."""
        ...

    def get_archive(self, container: str, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        """``path`` as a tar stream, with the engine's stat of it (name, size, mode)."""
        ...


class Terminal(Protocol):
    """An interactive command with a TTY in a sandbox: its bytes both ways, size, signals."""

    def send(self, data: bytes) -> None:
        """Bytes typed into the TTY."""
        ...

    def receive(self) -> bytes:
        """The TTY's next output (blocks); ``b""`` once the command ended."""
        ...

    def resize(self, rows: int, cols: int) -> None:
        """The TTY's new size."""
        ...

    def signal(self, name: str) -> None:
        """Send ``name`` (one of ``TERMINAL_SIGNALS``) to the command."""
        ...

    def exit_code(self) -> int | None:
        """Its exit code once it ended."""
        ...

    def close(self) -> None:
        """Hang up (the command gets SIGHUP from its TTY)."""
        ...


class SandboxTerminals(Protocol):
    """Terminals in running sandboxes."""

    def open_terminal(
        self, container: str, command: list[str], *, cwd: str, rows: int, cols: int
    ) -> Terminal:
        """Start ``command`` with a TTY in ``cwd``."""
        ...
