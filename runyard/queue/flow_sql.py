"""The named statements of flow control (``runyard.queue.flow``).

A job under flow limits is written held (``available_at`` infinity: no claim takes it) with
its scopes (``flow_scopes``). A gate pass releases held jobs: ``HELD_SCOPES`` names the scopes
of the oldest held jobs (making their ``flow_counters`` rows), then in one transaction
``LOCK_SCOPES`` locks those rows (in scope order, skipping the ones another gate holds),
``IN_FLIGHT`` counts each scope's jobs in flight — a new statement, so it sees every release
committed before the locks were taken — ``CANDIDATES`` locks the held jobs whose scopes are all
locked, the pure rule picks those that fit, and ``RELEASE`` lets them go, spends their tokens
and wakes the workers. No two gates release in one scope at
once, so a scope's maximum holds whatever number of workers and gates run; no session state
is used, so it holds behind a transaction pooler too.
"""

from __future__ import annotations

from typing import LiteralString

from runyard.queue.sql import _sql

# Held jobs, oldest first by claim order, that wait for no dependency nor a start time.
_HELD: LiteralString = """
    SELECT j.id, j.flow_scopes, j.queue, j.priority, j.created_at
    FROM tool_run_jobs j JOIN tool_runs r ON r.id = j.run_id
    WHERE j.status = 'queued' AND j.available_at = 'infinity' AND j.flow_scopes IS NOT NULL
      AND j.waiting_on = 0 AND (r.run_at IS NULL OR r.run_at <= {NOW})
"""

# ``:full``: scopes known to be at their maximum; their jobs are passed over, so runs of
# scopes with room behind a long line of held runs of full ones are found.
HELD_SCOPES = _sql(
    "WITH held AS MATERIALIZED ("
    + _HELD
    + """
          AND NOT (j.flow_scopes && CAST(:full AS text[]))
        ORDER BY j.priority DESC, j.created_at
        LIMIT :n
    ), scope AS (
        SELECT DISTINCT s FROM held CROSS JOIN LATERAL unnest(held.flow_scopes) s
    ), made AS (
        INSERT INTO flow_counters (scope) SELECT s FROM scope ON CONFLICT (scope) DO NOTHING
    )
    SELECT s AS scope FROM scope ORDER BY s
    """
)

# The scopes' rows, locked until the gate's commit; the clock of the pass (the statement's,
# not the transaction's start: buckets refill by the time that really passed).
LOCK_SCOPES = _sql(
    """
    SELECT scope, tokens, refilled_at,
           coalesce(CAST(:now AS timestamptz), clock_timestamp()) AS now
    FROM flow_counters
    WHERE scope = ANY(CAST(:scopes AS text[]))
    ORDER BY scope
    FOR UPDATE SKIP LOCKED
    """
)

# Each locked scope's jobs in flight: released to the claim (queued, no longer held) or
# running. A new statement after the locks: it sees every release committed before them.
IN_FLIGHT = _sql(
    """
    SELECT s.scope, (
        SELECT count(*) FROM tool_run_jobs f
        WHERE f.flow_scopes @> ARRAY[s.scope] AND f.flow_scopes IS NOT NULL
          AND f.status IN ('queued', 'running') AND f.available_at < 'infinity'
    ) AS in_flight
    FROM unnest(CAST(:scopes AS text[])) AS s(scope)
    """
)

# The held jobs whose every scope this pass locked, in claim order, locked (a cancel waits).
CANDIDATES = _sql(
    _HELD
    + """
      AND j.flow_scopes <@ CAST(:scopes AS text[])
    ORDER BY j.priority DESC, j.created_at
    LIMIT :n
    FOR UPDATE OF j SKIP LOCKED
    """
)

# The chosen jobs released to the claim, their scopes' tokens spent (``:tokens``: each rated
# scope's bucket after the pass), the workers of their queues woken.
RELEASE = _sql(
    """
    WITH released AS (
        UPDATE tool_run_jobs j SET available_at = {NOW}, updated_at = {NOW}
        WHERE j.id = ANY(CAST(:ids AS uuid[])) AND j.status = 'queued'
          AND j.available_at = 'infinity'
        RETURNING j.queue
    ), spent AS (
        UPDATE flow_counters c
        SET tokens = CAST(t.value AS double precision),
            refilled_at = coalesce(CAST(:now AS timestamptz), clock_timestamp())
        FROM jsonb_each_text(CAST(:tokens AS jsonb)) t
        WHERE c.scope = t.key
    )
    SELECT (SELECT count(*) FROM released) AS released,
           (SELECT count(pg_notify('runyard_jobs', q.queue))
            FROM (SELECT DISTINCT queue FROM released) q) AS woken
    """
)


# A tenant's submit bucket: one token taken if there is one. ``tokens_after`` is the bucket
# after the take, negative by what was missing when there was none (nothing is taken then);
# no row: the bucket is new (``NEW_BUCKET``).
TAKE_TOKEN = _sql(
    """
    WITH old AS MATERIALIZED (
        SELECT scope, least(CAST(:burst AS double precision), coalesce(
                   tokens + GREATEST(0, EXTRACT(EPOCH FROM
                       coalesce(CAST(:now AS timestamptz), clock_timestamp()) - refilled_at))
                   * :rate,
                   CAST(:burst AS double precision))) AS refill
        FROM flow_counters WHERE scope = :scope
        FOR UPDATE
    ), taken AS (
        UPDATE flow_counters c
        SET tokens = CASE WHEN old.refill >= 1 THEN old.refill - 1 ELSE old.refill END,
            refilled_at = coalesce(CAST(:now AS timestamptz), clock_timestamp())
        FROM old WHERE c.scope = old.scope
    )
    SELECT refill - 1 AS tokens_after FROM old
    """
)
NEW_BUCKET = _sql(
    """
    INSERT INTO flow_counters (scope, tokens, refilled_at)
    VALUES (:scope, CAST(:burst AS double precision) - 1,
            coalesce(CAST(:now AS timestamptz), clock_timestamp()))
    ON CONFLICT (scope) DO NOTHING
    RETURNING tokens AS tokens_after
    """
)
