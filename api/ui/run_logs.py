"""A run page's logs: each stream as chunks stamped with the time the worker stored them
(``runyard.domain.log_lines``), and the text the API's logs action reads, as a download."""

from __future__ import annotations

from typing import Any

from runyard.domain.log_lines import stamp_pieces
from runyard.platform.models import ToolRun
from runyard.reads.dashboard import LogSnapshot
from runyard.reads.runs import LOG_STREAMS


def log_context(run: ToolRun, snapshot: LogSnapshot) -> dict[str, Any]:
    """What ``_run_logs.html`` shows: the streams' text and, where the stored chunks still
    make up exactly that text, the chunks with their times (else the plain text)."""
    if run.status.is_terminal:
        text = {"stdout": run.stdout or "", "stderr": run.stderr or ""}
        upto, attempt = 0, run.attempts
        # The stored log is the capped whole; chunks pruned or capped differently show plain.
        same = snapshot.attempt == run.attempts and (snapshot.stdout, snapshot.stderr) == (
            text["stdout"],
            text["stderr"],
        )
        chunks = snapshot.chunks if same else ()
    else:
        text = {"stdout": snapshot.stdout, "stderr": snapshot.stderr}
        upto, attempt, chunks = snapshot.upto, snapshot.attempt, snapshot.chunks
    pieces = {
        stream: stamp_pieces((c.at, c.text) for c in chunks if c.stream == stream)
        if chunks or not text[stream]
        else None
        for stream in LOG_STREAMS
    }
    return {
        "stdout": text["stdout"],
        "stderr": text["stderr"],
        "stdout_pieces": pieces["stdout"],
        "stderr_pieces": pieces["stderr"],
        "upto": upto,
        "log_attempt": attempt,
    }
