"""The named statements of flow control (``runyard.queue.flow``).

A job under flow limits is written held (``available_at`` infinity: no claim takes it) with
its scopes (``flow_scopes``). Each scope has a row in ``flow_counters``: its jobs in flight
(released or running), its token bucket and the limits the last gate applied. A gate pass:
``HELD_SCOPES`` names the scopes of the oldest held jobs that no scope known to be full holds
(making rows for new scopes); then, in one transaction, ``LOCK_SCOPES`` locks those rows in
scope order, skipping the ones another gate holds, and reads their counts as the last writer
left them; ``CANDIDATES`` locks the held jobs whose every scope is locked; the pure rule picks
those that fit; ``RELEASE`` lets them go, adds them to their scopes' counts, spends their
tokens and wakes the workers. A pass that finds no scope asks ``ANY_HELD``: with none held,
a resting gate skips its passes until a held job's notification or its fallback period. A
job that ends leaves its scopes' counts by a trigger (migration 0021). No two gates release
in one scope at once and every count is changed under its row's lock, so a scope's maximum
holds whatever number of workers and gates run; no session state is used, so it holds behind
a transaction pooler too.
"""

from __future__ import annotations

from typing import LiteralString

from runyard.queue.sql import _sql

_CLOCK: LiteralString = "coalesce(CAST(:now AS timestamptz), clock_timestamp())"

# Held jobs, oldest first by claim order, that wait for no dependency nor a start time.
_HELD: LiteralString = """
    SELECT j.id, j.flow_scopes, j.queue, j.priority, j.created_at
    FROM tool_run_jobs j JOIN tool_runs r ON r.id = j.run_id
    WHERE j.status = 'queued' AND j.available_at = 'infinity' AND j.flow_scopes IS NOT NULL
      AND j.waiting_on = 0 AND (r.run_at IS NULL OR r.run_at <= {NOW})
"""

# Passed over: a held job of a scope that was full at its last gate (at its maximum, or its
# bucket empty by the rate then applied), so held runs of scopes with room behind a long line
# of a full scope's runs are found. A scope's row says it until a gate counts it again.
HELD_SCOPES = _sql(
    "WITH held AS MATERIALIZED ("
    + _HELD
    + """
          AND NOT EXISTS (
              SELECT 1 FROM flow_counters c
              WHERE c.scope = ANY(j.flow_scopes)
                AND (c.in_flight >= c.max_running
                     OR least(GREATEST(1, c.per_second), c.tokens + GREATEST(0, EXTRACT(
                            EPOCH FROM {CLOCK} - c.refilled_at)) * c.per_second) < 1))
        ORDER BY j.priority DESC, j.created_at
        LIMIT :n
    ), scope AS (
        SELECT DISTINCT s FROM held CROSS JOIN LATERAL unnest(held.flow_scopes) s
    ), made AS (
        INSERT INTO flow_counters (scope) SELECT s FROM scope ON CONFLICT (scope) DO NOTHING
    )
    SELECT s AS scope FROM scope ORDER BY s
    """.replace("{CLOCK}", _CLOCK)
)

# Whether any job is held at all (whatever it waits for): an index probe of the gate's own
# partial index. None held: the gate may rest until a held job is written (``runyard_held``).
ANY_HELD = _sql(
    """
    SELECT EXISTS (
        SELECT 1 FROM tool_run_jobs
        WHERE status = 'queued' AND available_at = 'infinity' AND flow_scopes IS NOT NULL
    ) AS held
    """
)

# The scopes' rows, locked until the gate's commit, with their counts as the last writer left
# them; the clock of the pass (the statement's, not the transaction's start: buckets refill
# by the time that really passed).
LOCK_SCOPES = _sql(
    """
    SELECT scope, in_flight, tokens, refilled_at, {CLOCK} AS now
    FROM flow_counters
    WHERE scope = ANY(CAST(:scopes AS text[]))
    ORDER BY scope
    FOR UPDATE SKIP LOCKED
    """.replace("{CLOCK}", _CLOCK)
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

# The chosen jobs released to the claim and the workers of their queues woken; ``:counters``:
# per locked scope the jobs it released (``add``), its bucket after the pass (``tokens``) and
# the limits applied (``max``, ``rate``).
RELEASE = _sql(
    """
    WITH released AS (
        UPDATE tool_run_jobs j SET available_at = {NOW}, updated_at = {NOW}
        WHERE j.id = ANY(CAST(:ids AS uuid[])) AND j.status = 'queued'
          AND j.available_at = 'infinity'
        RETURNING j.queue
    ), counted AS (
        UPDATE flow_counters c
        SET in_flight = c.in_flight + CAST(t.value ->> 'add' AS integer),
            tokens = CAST(t.value ->> 'tokens' AS double precision),
            max_running = CAST(t.value ->> 'max' AS integer),
            per_second = CAST(t.value ->> 'rate' AS double precision),
            refilled_at = {CLOCK}
        FROM jsonb_each(CAST(:counters AS jsonb)) t
        WHERE c.scope = t.key
    )
    SELECT (SELECT count(*) FROM released) AS released,
           (SELECT count(pg_notify('runyard_jobs', q.queue))
            FROM (SELECT DISTINCT queue FROM released) q) AS woken
    """.replace("{CLOCK}", _CLOCK)
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
