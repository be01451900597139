"""The named statements of schedules: a tenant's records, and the scheduler's take and advance.

Every statement that reads or changes one schedule names its tenant (another tenant's schedule
is not there). The scheduler takes one due schedule at a time, locked ``SKIP LOCKED`` until its
transaction ends: several schedulers share the due schedules and never fire one at once. The
runs it fires are written in that transaction (``runyard.queue.graph.GraphWriter.write_in``).
"""

from __future__ import annotations

from runyard.queue.sql import _sql

# A schedule's public columns, as every read returns them.
_COLUMNS = """
    id, tool, input, priority, cron, every_seconds, timezone, start_at, end_at, catch_up,
    paused, next_slot_at, created_at, updated_at, fired, skipped, last_slot_at, last_run_id,
    last_error
"""

# A new schedule, unless the tenant has ``:cap`` already (0: no cap). Two creates at once may
# both pass the count: the cap bounds a tenant's rows, it is no exact quota.
INSERT_SCHEDULE = _sql(
    """
    INSERT INTO schedules (id, tenant, tool, input, priority, cron, every_seconds, timezone,
                           start_at, end_at, catch_up, next_slot_at, created_at, updated_at)
    SELECT :id, :tenant, :tool, CAST(:input AS jsonb), :priority, :cron, :every_seconds,
           :timezone, :start_at, :end_at, :catch_up, :next_slot_at, {NOW}, {NOW}
    WHERE :cap <= 0 OR (SELECT count(*) FROM schedules WHERE tenant = :tenant) < :cap
    RETURNING """
    + _COLUMNS
)

GET_SCHEDULE = _sql("SELECT " + _COLUMNS + " FROM schedules WHERE id = :id AND tenant = :tenant")

# A page of the tenant's schedules, newest first after the keyset position.
SCHEDULE_PAGE = _sql(
    "SELECT "
    + _COLUMNS
    + """
    FROM schedules
    WHERE tenant = :tenant
      AND (CAST(:before AS timestamptz) IS NULL
           OR (created_at, id) < (CAST(:before AS timestamptz), CAST(:before_id AS uuid)))
    ORDER BY created_at DESC, id DESC
    LIMIT :limit
    """
)

PAUSE_SCHEDULE = _sql(
    "UPDATE schedules SET paused = true, updated_at = {NOW}"
    " WHERE id = :id AND tenant = :tenant RETURNING " + _COLUMNS
)

# A resume starts again from ``:next_slot_at`` (the first slot from now): the slots that fell
# while it was paused are skipped, whatever its catch_up. The lock orders it with a pass that
# holds the schedule: that pass's cursor is read, then replaced.
LOCK_SCHEDULE = _sql(
    "SELECT cron, every_seconds, timezone, start_at, end_at, paused, {NOW} AS now"
    " FROM schedules WHERE id = :id AND tenant = :tenant FOR UPDATE"
)
RESUME_SCHEDULE = _sql(
    "UPDATE schedules SET paused = false, next_slot_at = :next_slot_at, updated_at = {NOW}"
    " WHERE id = :id AND tenant = :tenant RETURNING " + _COLUMNS
)

# The runs it made keep its id and their slot; nothing else refers to it.
DELETE_SCHEDULE = _sql("DELETE FROM schedules WHERE id = :id AND tenant = :tenant RETURNING id")

# The due schedule with the oldest cursor that no other scheduler holds, locked until the
# pass's transaction ends, with the clock of the pass.
TAKE_DUE = _sql(
    """
    SELECT id, tenant, tool, input, priority, cron, every_seconds, timezone, start_at, end_at,
           catch_up, next_slot_at, {NOW} AS now
    FROM schedules
    WHERE NOT paused AND next_slot_at IS NOT NULL AND next_slot_at <= {NOW}
    ORDER BY next_slot_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
    """
)

# The cursor moved past the slots a pass decided, with what it fired, in the transaction that
# wrote their runs.
ADVANCE = _sql(
    """
    UPDATE schedules
    SET next_slot_at = :next_slot_at, updated_at = {NOW},
        fired = fired + :fired, skipped = skipped + :skipped,
        last_slot_at = coalesce(CAST(:last_slot_at AS timestamptz), last_slot_at),
        last_run_id = coalesce(CAST(:last_run_id AS uuid), last_run_id),
        last_error = :last_error
    WHERE id = :id
    """
)
