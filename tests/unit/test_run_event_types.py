"""``runyard.domain.run_events`` lists exactly the event types the code writes: every statement
that inserts into ``tool_run_events`` and every note an attempt records is read for them."""

from __future__ import annotations

import re
from pathlib import Path

from runyard.domain.run_events import (
    ATTEMPT_NOTE_TYPES,
    RUN_EVENT_TYPES,
    TRANSITION_EVENT_TYPES,
)
from runyard.queue import RESERVED_EVENT_TYPES
from runyard.reads.runs import LOG_STREAMS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["runyard", "worker", "reaper", "migrations/versions"]
INSERT = "INSERT INTO tool_run_events"
# The type column: the third item of ``SELECT run_id, <time>, 'type'``, the type of a row of
# ``VALUES ((n,) 'type', data)``, or both branches of ``(CASE WHEN … THEN 'a' ELSE 'b' END,``.
SELECTED = re.compile(r"\A\s*\([^)]*\)\s*SELECT\s+[\w.]+,\s*[\w{}()]+,\s*'([a-z_]+)'")
ROW = re.compile(r"^\s*\((?:\d+,\s*)?'([a-z_]+)',", re.MULTILINE)
CASE_ROW = re.compile(r"^\s*\(CASE WHEN [^,]*? THEN '([a-z_]+)' ELSE '([a-z_]+)' END,", re.M)
# A type bound as a parameter: the live log's stream, or an attempt's note.
BOUND = re.compile(r"\A\s*\([^)]*\)\s*SELECT\s+[\w.]+,\s*[\w{}()]+,\s*:(\w+)")
NOTE = re.compile(r"note\(\s*\"([a-z][a-z0-9_]*)\"")


def statements() -> list[str]:
    """From each insert into tool_run_events to the first line that closes a bracket."""
    found = []
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            text = path.read_text()
            for match in re.finditer(re.escape(INSERT), text):
                rest = text[match.end() :]
                end = re.search(r"^\s*\)", rest, re.MULTILINE)
                found.append(rest[: end.start() if end else len(rest)])
    return found


def written_types() -> tuple[set[str], set[str]]:
    """The literal types the statements write, and the parameters that bind a type."""
    literal: set[str] = set()
    bound: set[str] = set()
    for statement in statements():
        if selected := SELECTED.match(statement):
            literal.add(selected[1])
        if parameter := BOUND.match(statement):
            bound.add(parameter[1])
        literal.update(ROW.findall(statement))
        for pair in CASE_ROW.findall(statement):
            literal.update(pair)
    return literal, bound


def noted_types() -> set[str]:
    """The kinds the runners record as notes under an attempt's lease."""
    found: set[str] = set()
    for source in ("runyard", "worker"):
        for path in (ROOT / source).rglob("*.py"):
            found.update(NOTE.findall(path.read_text()))
    return found


def test_statements__are_found_in_the_queue_webhooks_and_migrations():
    assert len(statements()) >= 15


def test_written_types__are_exactly_the_listed_ones():
    literal, bound = written_types()
    # :stream is a live log chunk's (JobQueue.append_log), :type an attempt's note.
    assert bound == {"stream", "type"}
    written = literal | set(LOG_STREAMS) | noted_types()
    assert written == RUN_EVENT_TYPES


def test_noted_types__are_the_attempt_notes():
    assert noted_types() == ATTEMPT_NOTE_TYPES


def test_reserved_types__are_the_transitions_and_lease_lost():
    assert RESERVED_EVENT_TYPES == TRANSITION_EVENT_TYPES | {"lease_lost"}
    assert not ATTEMPT_NOTE_TYPES & RESERVED_EVENT_TYPES
