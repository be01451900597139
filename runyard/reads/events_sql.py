"""The named reads of a run's events in delivery order (every reader of events uses it).

Event ids come from a sequence when a row is inserted, not when it commits, so a reader that
pages with ``id > after`` skips for good a row that commits after a row with a larger id.
Readers therefore order a run's events by ``(xact_id, id)`` (``xact_id`` is the inserting
transaction, a column default) and deliver only rows *below the horizon*: ``xact_id`` older
than every transaction still in progress, as the statement's own snapshot sees them. Such a
row's transaction has ended and every row a later commit adds sorts after it, so a cursor
never passes a row that is not there yet. Rows above the horizon are "held": they come on a
later read, once the older transactions have ended.
"""

from __future__ import annotations

from typing import LiteralString

from sqlalchemy import TextClause, text

# Evaluated once per statement (an InitPlan), on the statement's snapshot.
_HORIZON: LiteralString = (
    "(SELECT CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint))"
)

# Where event :after sits in the run's order: its own place, or (an id that is not one of the
# run's events; 0 = the start) after every event with a smaller id.
_POSITION: LiteralString = """
    ((SELECT coalesce(
        (SELECT xact_id FROM tool_run_events WHERE id = :after AND run_id = :run_id),
        (SELECT max(xact_id) FROM tool_run_events WHERE run_id = :run_id AND id < :after),
        0)), :after)
"""


def _sql(statement: LiteralString) -> TextClause:
    return text(statement.replace("{HORIZON}", _HORIZON).replace("{POSITION}", _POSITION))


# The run's events after :after in delivery order. ``ready`` rows are below the horizon and
# come first; the rows after them are held (shown so a caller knows more is committed).
EVENTS_AFTER = _sql(
    """
    SELECT id, run_id, at, type, data, xact_id < {HORIZON} AS ready
    FROM tool_run_events
    WHERE run_id = :run_id AND (xact_id, id) > {POSITION}
    ORDER BY xact_id, id
    LIMIT :limit
    """
)


# A page that shows the current attempt's live logs, then streams the events after ``upto``:
# ``upto`` is the last event below the horizon, and the chunks are every one up to it, read on
# the same snapshot, so the stream continues with no gap and no repeat.
LOG_SNAPSHOT = _sql(
    """
    WITH run AS MATERIALIZED (
        SELECT attempts FROM tool_runs WHERE id = :run_id
    ), last AS MATERIALIZED (
        SELECT id, xact_id FROM tool_run_events
        WHERE run_id = :run_id AND xact_id < {HORIZON}
        ORDER BY xact_id DESC, id DESC
        LIMIT 1
    )
    SELECT run.attempts, last.id AS upto, e.type, e.text, e.at
    FROM run LEFT JOIN last ON true
    LEFT JOIN LATERAL (
        SELECT type, data->>'text' AS text, at, xact_id, id FROM tool_run_events
        WHERE run_id = :run_id AND (xact_id, id) <= (last.xact_id, last.id)
          AND type IN ('stdout', 'stderr') AND data->>'attempt' = CAST(run.attempts AS text)
    ) e ON true
    ORDER BY e.xact_id, e.id
    """
)
