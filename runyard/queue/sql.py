"""The named SQL statements of ``runyard.queue``, one per operation (read them there).

``{NOW}`` in a statement stands for the injected clock or, when ``:now`` is NULL, the
database's ``now()``; every time-based statement takes it so tests move the clock.
"""

from __future__ import annotations

from typing import LiteralString

from sqlalchemy import TextClause, text

_NOW = "coalesce(CAST(:now AS timestamptz), now())"


def _sql(statement: LiteralString) -> TextClause:
    """Compile a named statement; ``{NOW}`` stands for the injected-or-database clock."""
    return text(statement.replace("{NOW}", _NOW))


# A run and its job, written together. ``:owner`` NULL: a queued job (queue mode). Else a sync
# run, claimed in the same statement by the API process ``:owner`` that runs it inline, under
# the same lease as any claim: attempt 1, a fresh ``lease_token``, its engine, its deadline.
# It has one attempt, and its container counts as requested from the start: nothing waits in
# a queue in sync mode, so a sync attempt is never retried nor given back uncharged (REQUEUE
# fails it, REQUEUE_UNSTARTED never applies to it).
_ENQUEUE_CTES: LiteralString = """
    run AS (
        INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at,
                               started_at, attempts, max_attempts, idempotency_key,
                               request_hash, callback_url, rerun_of, concurrency_key)
        SELECT :run_id, :tenant, :tool, CAST(:spec AS jsonb), CAST(:input AS jsonb),
               CASE WHEN claim.by_api THEN 'running' ELSE 'queued' END::run_status,
               CASE WHEN claim.by_api THEN 'sync' ELSE 'queue' END, {NOW},
               CASE WHEN claim.by_api THEN {NOW} END, CAST(claim.by_api AS integer),
               CASE WHEN claim.by_api THEN 1 ELSE :max_attempts END,
               :idempotency_key, :request_hash, CAST(:callback_url AS text),
               CAST(:rerun_of AS uuid), CAST(:concurrency_key AS text)
        FROM admitted, claim
        ON CONFLICT (tenant, idempotency_key) DO NOTHING
        RETURNING id, status, attempts, max_attempts, requested_at, tool, run_at, concurrency_key
    ), job AS (
        INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, priority, attempts,
                                   max_attempts, timeout_seconds, available_at, created_at,
                                   updated_at, started_at, locked_by, locked_until, lease_token,
                                   engine_id, deadline_at, container_requested_at, build_tag,
                                   flow_scopes)
        SELECT :job_id, run.id, run.status, :queue, :tenant, :priority, run.attempts,
               run.max_attempts,
               :timeout_seconds,
               -- Held (no claim takes it) until a flow gate releases it (runyard.queue.flow).
               CASE WHEN CAST(:flow_scopes AS text[]) IS NULL THEN {NOW}
                    ELSE CAST('infinity' AS timestamptz) END,
               {NOW}, {NOW},
               CASE WHEN claim.by_api THEN {NOW} END, CAST(:owner AS text),
               {NOW} + make_interval(secs => CAST(:lease AS double precision)),
               CASE WHEN claim.by_api THEN gen_random_uuid() END, CAST(:engine_id AS text),
               CASE WHEN claim.by_api THEN {NOW} + make_interval(
                   secs => CAST(:timeout_seconds AS double precision)) END,
               CASE WHEN claim.by_api THEN {NOW} END,
               coalesce(CAST(:spec AS jsonb) #>> '{build,tag}', ''),
               CAST(:flow_scopes AS text[])
        FROM run, claim
        RETURNING id, run_id, attempts, max_attempts, lease_token, locked_until, deadline_at,
                  started_at, container_requested_at, waiting_on, available_at, flow_scopes,
                  queue
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT job.run_id, {NOW}, e.type, e.data FROM job, claim
        CROSS JOIN LATERAL (VALUES
            (1, 'status', jsonb_build_object('status', 'queued')
                          || CASE WHEN claim.by_api THEN '{"mode": "sync"}'::jsonb
                                  ELSE '{}'::jsonb END),
            (2, 'claimed', CASE WHEN claim.by_api THEN jsonb_build_object(
                'attempt', 1, 'worker_id', CAST(:owner AS text),
                'engine_id', CAST(:engine_id AS text)) END),
            (3, 'status', CASE WHEN claim.by_api THEN jsonb_build_object(
                'status', 'running', 'attempt', 1) END)
        ) AS e(n, type, data)
        WHERE e.data IS NOT NULL
        ORDER BY e.n
    )
"""

_CLAIM_AT_INSERT: LiteralString = "claim AS (SELECT CAST(:owner AS text) IS NOT NULL AS by_api), "

# A job written held wakes the flow gates, which pass only when something may be held
# (``runyard.queue.flow``).
_HELD_NOTIFY: LiteralString = """
    CASE WHEN CAST(:flow_scopes AS text[]) IS NOT NULL
         THEN pg_notify('runyard_held', CAST(:queue AS text)) END AS held_notified
"""

# A queued job that waits for a build wakes the workers' build rounds, which rest while no
# queued job waits for one (``worker.builds``).
_BUILD_NOTIFY: LiteralString = """
    CASE WHEN NOT claim.by_api AND coalesce(CAST(:spec AS jsonb) #>> '{build,tag}', '') <> ''
         THEN pg_notify('runyard_builds', CAST(:queue AS text)) END AS build_notified
"""

ENQUEUE = _sql(
    "WITH admitted AS (SELECT 1), "
    + _CLAIM_AT_INSERT
    + _ENQUEUE_CTES
    + "SELECT id, pg_notify('runyard_jobs', CAST(:queue AS text)), "
    + _HELD_NOTIFY
    + ", "
    + _BUILD_NOTIFY
    + " FROM run, claim"
)


# Admission of one submit, in the submit's own statement and transaction. ``gate`` locks the
# tenant's row 0 of tenant_run_counts until the commit and reads its latest committed version
# (ON CONFLICT DO UPDATE does, whatever the statement's snapshot). Every insert of a run is
# counted in row 0 by the statement that makes it (migrations 0006 and 0016), so a submit sees
# every submit of the tenant committed before it, in whatever API process: the N-th submit
# with N-1 queued runs is the last one admitted. The other rows, changed by workers and
# deletes, are read as of the snapshot; with no caps nothing is locked. A key already used is
# a replay, never refused: no row is written (``replayed``); a concurrent submit of the same
# key that commits first leaves ``id`` NULL.
# The tenant's queued, running and stored runs, and the runs it created in the current window
# (``active``), its row 0 locked until the commit; shared by every admission (``SUBMIT``,
# ``ADMIT_MANY``). The window is row 0's; the insert triggers add every run inserted to it,
# failed and cancelled ones too. ``window_ends_at`` is when the runs created now stop counting.
# ``gate`` starts a new window, from nothing created, only once the stored one has passed
# (``{NOW} >= start + window``), so a window never moves back: ``{NOW}`` is the transaction's
# start, and a transaction that began before another one started the window (a batch locks its
# dependencies before it is admitted) sees that start in its future; the window is current for
# it, and the runs counted in it stay counted. Only a clock that went back past the start
# (read as the statement runs, ``{CLOCK}``, which a committed start can never be after
# otherwise) restarts the window at ``{NOW}``, keeping its count.
TENANT_COUNTS_CTES: LiteralString = (
    """
    gate AS MATERIALIZED (
        INSERT INTO tenant_run_counts AS c (tenant, shard, window_started_at)
        SELECT :tenant, 0, {NOW}
        WHERE :queued_cap > 0 OR :running_cap > 0 OR :created_cap > 0 OR :stored_cap > 0
        ON CONFLICT (tenant, shard) DO UPDATE
        SET window_started_at = CASE WHEN {CLOCK_WENT_BACK} THEN {NOW}
                                     WHEN {PASSED} THEN {NOW}
                                     ELSE c.window_started_at END,
            window_created = CASE WHEN {CLOCK_WENT_BACK} THEN c.window_created
                                  WHEN {PASSED} THEN 0
                                  ELSE c.window_created END
        RETURNING queued, running, stored, window_created, window_started_at
    ), active AS MATERIALIZED (
        SELECT coalesce(sum(queued), 0) AS queued, coalesce(sum(running), 0) AS running,
               coalesce(sum(stored), 0) AS stored,
               coalesce((SELECT window_created FROM gate), 0) AS created,
               (SELECT window_started_at FROM gate) + {WINDOW} AS window_ends_at
        FROM (SELECT queued, running, stored FROM gate
              UNION ALL
              SELECT queued, running, stored FROM tenant_run_counts
              WHERE tenant = :tenant AND shard <> 0 AND EXISTS (SELECT 1 FROM gate)) rows
    )""".replace("{CLOCK_WENT_BACK}", "{CLOCK} < c.window_started_at")
    # No window yet (a row the triggers made, its start NULL) has passed.
    .replace("{PASSED}", "NOT coalesce({NOW} < c.window_started_at + {WINDOW}, false)")
    .replace("{WINDOW}", "make_interval(secs => CAST(:window_seconds AS double precision))")
    .replace("{CLOCK}", "coalesce(CAST(:now AS timestamptz), clock_timestamp())")
)

# Whole seconds until the window's runs stop counting (1 at least): a created cap's Retry-After.
WINDOW_RETRY_AFTER: LiteralString = (
    "GREATEST(1, CAST(ceil(EXTRACT(EPOCH FROM window_ends_at - {NOW})) AS integer))"
)

_ADMISSION_CTES: LiteralString = (
    TENANT_COUNTS_CTES
    + """, decision AS MATERIALIZED (
        SELECT EXISTS (SELECT 1 FROM tool_runs
                       WHERE tenant = :tenant AND idempotency_key = :idempotency_key)
                   AS replayed,
               CASE WHEN 0 < :queued_cap AND :queued_cap <= queued THEN 'tenant_queued'
                    WHEN 0 < :running_cap AND :running_cap <= running THEN 'tenant_running'
                    WHEN 0 < :created_cap AND :created_cap <= created THEN 'tenant_created'
                    WHEN 0 < :stored_cap AND :stored_cap <= stored THEN 'tenant_stored'
               END AS refused,
               """
    + WINDOW_RETRY_AFTER
    + """ AS window_retry_after
        FROM active
    ), admitted AS (
        SELECT 1 FROM decision WHERE NOT replayed AND refused IS NULL
    )
"""
)

# Why a queued job ``j`` of the run ``r`` may wait long, as a run shows it (``waiting_for``):
# its dependencies, its flow limits, its start time, or no live worker of its queue (one seen
# within ``:live`` seconds); NULL when none of these holds.
WAITING_FOR: LiteralString = """CASE
            WHEN j.waiting_on > 0 THEN format('%s of its dependencies to succeed', j.waiting_on)
            WHEN j.available_at = 'infinity' AND j.flow_scopes IS NOT NULL THEN
                'its flow limits: ' || (
                    SELECT string_agg(CASE split_part(s, ':', 1)
                                      WHEN 'key' THEN 'concurrency_key ' || r.concurrency_key
                                      WHEN 'tool' THEN 'tool ' || r.tool
                                      ELSE 'tenant' END, ', ' ORDER BY s)
                    FROM unnest(j.flow_scopes) s)
            WHEN j.available_at > now() AND r.run_at IS NOT NULL THEN 'its run_at time'
            WHEN NOT EXISTS (
                SELECT 1 FROM workers w
                WHERE j.queue = ANY(w.queues) AND w.stopped_at IS NULL
                  AND w.last_seen_at > now() - make_interval(secs => :live))
            THEN 'no live worker serves queue ' || j.queue END"""

# ENQUEUE with admission: ``run_id`` is the new run's; else ``replayed`` or ``refused`` says
# why. A sync run (``:owner`` set) comes back claimed, its job's row shaped like CLAIM's; only
# queued work wakes the workers. A queued run comes back with what a read of it would show
# that the caller does not know already (``run_requested_at``, its input as stored,
# ``waiting_for``), so the answer of the submit needs no read.
SUBMIT = _sql(
    "WITH "
    + _ADMISSION_CTES
    + ", "
    + _CLAIM_AT_INSERT
    + _ENQUEUE_CTES
    + """
    SELECT job.run_id, d.replayed, d.refused, d.window_retry_after, job.id, job.attempts,
           job.max_attempts,
           job.lease_token, job.locked_until, job.deadline_at, job.started_at,
           job.started_at AS requested_at, job.container_requested_at,
           CAST(NULL AS timestamptz) AS cancel_requested_at, false AS adopted,
           CAST(:spec AS jsonb) AS spec, CAST(:input AS jsonb) AS input,
           (SELECT requested_at FROM run) AS run_requested_at,
           CASE WHEN job.run_id IS NOT NULL AND NOT claim.by_api
                THEN (SELECT """
    + WAITING_FOR
    + """ FROM job j, run r) END AS waiting_for,
           CASE WHEN job.run_id IS NOT NULL AND NOT claim.by_api
                THEN pg_notify('runyard_jobs', CAST(:queue AS text)) END AS notified,
           CASE WHEN job.run_id IS NOT NULL THEN (SELECT """
    + _HELD_NOTIFY
    + """) END AS held,
           CASE WHEN job.run_id IS NOT NULL THEN (SELECT """
    + _BUILD_NOTIFY
    + """) END AS build
    FROM decision d CROSS JOIN claim LEFT JOIN job ON true
    """
)


FIND_IDEMPOTENT = _sql(
    "SELECT id, request_hash FROM tool_runs WHERE tenant = :tenant AND idempotency_key = :key"
)


# Adoption first (same engine, lease cleared, not held back by RELEASE_LATER), then queued
# work, fair between tenants (docs/decisions/0012-fair-tenants-by-running-share.md): a skip
# scan of the ``(queue, tenant, build_tag, …)`` index finds the tenants with queued work in
# each of the worker's queues, one probe per tenant and build its runs wait for ('' for
# none); a group whose build is not ready on this engine offers nothing, so runs waiting for
# a build never wedge the claim nor hold other runs back; each other group offers its
# oldest due jobs, unlocked (``:limit`` plus a few spare ones, so claims racing for the same
# offers still find one);
# within a priority the claim locks first the offer that leaves its tenant with the fewest
# running runs (running now + its rank among the tenant's offers), SKIP LOCKED, no more rows
# than it takes. Cost: O(queues * tenants with work * limit) index probes, flat however deep
# the backlog is. The selections are MATERIALIZED so the planner cannot re-run them and lock
# more rows than the limit; the picked ids reach the UPDATEs and the final join as arrays and
# primary-key lookups. Jobs held by flow limits (``available_at`` infinity, released by
# ``runyard.queue.flow``) are not in the index the probes read: the claim never steps over them.
_CLAIM_CTES: LiteralString = """
    adoptable AS MATERIALIZED (
        SELECT id FROM tool_run_jobs
        WHERE status = 'running' AND {ADOPTABLE} AND engine_id = :engine_id
          AND available_at <= {NOW}
        ORDER BY priority DESC, created_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), wanted AS MATERIALIZED (
        SELECT GREATEST(:limit - (SELECT count(*) FROM adoptable), 0) AS n
    ), groups (queue, tenant, build_tag) AS (
        SELECT q.name, g.tenant, g.build_tag
        FROM {QUEUES} AS q(name) CROSS JOIN wanted CROSS JOIN LATERAL (
            SELECT tenant, build_tag FROM tool_run_jobs
            WHERE status = 'queued' AND waiting_on = 0 AND queue = q.name AND {FRESH}
              AND available_at < 'infinity'
            ORDER BY tenant, build_tag LIMIT 1
        ) g
        WHERE wanted.n > 0
        UNION ALL
        SELECT t.queue, g.tenant, g.build_tag
        FROM groups t CROSS JOIN LATERAL (
            SELECT tenant, build_tag FROM tool_run_jobs
            WHERE status = 'queued' AND waiting_on = 0 AND queue = t.queue
              AND available_at < 'infinity'
              AND (tenant, build_tag) > (t.tenant, t.build_tag)
            ORDER BY tenant, build_tag LIMIT 1
        ) g
    ), offers AS MATERIALIZED (
        SELECT o.id, o.priority, o.created_at,
               (SELECT coalesce(sum(c.running), 0) FROM tenant_run_counts c
                WHERE c.tenant = t.tenant)
               + row_number() OVER (
                   PARTITION BY t.tenant ORDER BY o.priority DESC, o.created_at) AS share
        FROM groups t CROSS JOIN wanted CROSS JOIN LATERAL (
            SELECT id, priority, created_at FROM tool_run_jobs
            WHERE status = 'queued' AND waiting_on = 0 AND queue = t.queue AND tenant = t.tenant
              AND build_tag = t.build_tag AND available_at < 'infinity'
              AND available_at <= {NOW} AND attempts < max_attempts
            ORDER BY priority DESC, created_at
            LIMIT wanted.n + {SPARE}
        ) o
        WHERE t.build_tag = '' OR EXISTS (
            SELECT 1 FROM tool_builds b
            WHERE b.tag = t.build_tag AND b.engine_id = :engine_id AND b.status = 'ready')
    ), ranked AS MATERIALIZED (
        SELECT coalesce(array_agg(id ORDER BY priority DESC, share, created_at),
                        CAST('{}' AS uuid[])) AS ids
        FROM offers
    ), fresh AS MATERIALIZED (
        -- The status test is written so that it cannot match the predicate of the queued
        -- jobs' partial index: otherwise the planner, judging that index small (as it was at
        -- the last ANALYZE), reads all of it and filters by id instead of probing the ids.
        SELECT id FROM tool_run_jobs
        WHERE id = ANY(CAST((SELECT ids FROM ranked) AS uuid[]))
          AND CAST(status AS text) = 'queued' AND waiting_on = 0
        ORDER BY array_position((SELECT ids FROM ranked), id)
        LIMIT (SELECT n FROM wanted)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        -- SET reads the row as it was: only adoptable rows were already running.
        UPDATE tool_run_jobs j SET
            status = 'running',
            attempts = j.attempts + CASE WHEN j.status = 'running' THEN 0 ELSE 1 END,
            locked_by = :worker_id,
            locked_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
            lease_token = gen_random_uuid(),
            engine_id = :engine_id,
            started_at = CASE WHEN j.status = 'running' THEN j.started_at ELSE {NOW} END,
            deadline_at = CASE WHEN j.status = 'running' THEN j.deadline_at
                          ELSE {NOW} + make_interval(secs => j.timeout_seconds) END,
            container_requested_at = CASE WHEN j.status = 'running'
                                     THEN j.container_requested_at ELSE NULL END,
            updated_at = {NOW}
        WHERE j.id = ANY(ARRAY(SELECT id FROM adoptable UNION ALL SELECT id FROM fresh))
        RETURNING j.id, j.run_id, j.attempts, j.max_attempts, j.lease_token, j.locked_until,
                  j.deadline_at, j.started_at, j.cancel_requested_at, j.priority,
                  j.created_at, j.container_requested_at,
                  j.id = ANY(ARRAY(SELECT id FROM adoptable)) AS adopted
    ), claimed_run AS (
        UPDATE tool_runs r SET status = 'running',
                               started_at = coalesce(r.started_at, c.started_at),
                               attempts = c.attempts
        FROM claimed c
        WHERE r.id = ANY(ARRAY(SELECT run_id FROM claimed WHERE NOT adopted))
          AND r.id = c.run_id
    ), claimed_event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT c.run_id, {NOW}, e.type, e.data
        FROM claimed c
        CROSS JOIN LATERAL (VALUES
            (CASE WHEN c.adopted THEN 'adopted' ELSE 'claimed' END,
             jsonb_build_object('attempt', c.attempts, 'worker_id', CAST(:worker_id AS text))),
            ('status', CASE WHEN c.adopted THEN NULL
                       ELSE jsonb_build_object('status', 'running', 'attempt', c.attempts) END)
        ) AS e(type, data)
        WHERE e.data IS NOT NULL
    )
"""

# What the runs a claimed run depends on returned (``/runyard/deps.json``) and their published
# artifact sets (``/runyard/deps/<run id>/``), keyed by run id; NULL for a run that depends
# on none (or on none with artifacts).
_DEPS: LiteralString = """
    (SELECT jsonb_object_agg(CAST(p.id AS text), jsonb_build_object(
                'tool', p.tool, 'ref', p.ref, 'status', p.status, 'result', p.result))
     FROM tool_run_deps d JOIN tool_runs p ON p.id = d.depends_on
     WHERE d.run_id = c.run_id) AS deps,
    (SELECT jsonb_object_agg(CAST(p.id AS text), p.artifact_set)
     FROM tool_run_deps d JOIN tool_runs p ON p.id = d.depends_on
     WHERE d.run_id = c.run_id AND p.artifact_set IS NOT NULL) AS dep_artifacts
"""

_CLAIMED: LiteralString = (
    """
    SELECT c.id, c.run_id, c.attempts, c.max_attempts, c.lease_token, c.locked_until,
           c.deadline_at, c.cancel_requested_at, c.container_requested_at, c.adopted,
           c.started_at, r.requested_at, r.spec, r.input,"""
    + _DEPS
    + """
    FROM claimed c CROSS JOIN LATERAL (
        SELECT requested_at, spec, input FROM tool_runs WHERE id = c.run_id
    ) r
"""
)

_ORDER: LiteralString = "ORDER BY c.adopted DESC, c.priority DESC, c.created_at"


def _claim_ctes(
    queues: LiteralString,
    adoptable: LiteralString = "locked_until IS NULL",
    fresh: LiteralString = "true",
) -> LiteralString:
    """The claim's CTEs: ``adoptable`` picks running jobs of the engine, queued ones come
    from the rows of ``queues`` (a one-column relation) while ``fresh`` holds."""
    return (
        _CLAIM_CTES.replace("{ADOPTABLE}", adoptable)
        .replace("{QUEUES}", queues)
        .replace("{FRESH}", fresh)
        .replace("{SPARE}", "16")
    )


_ONE_QUEUE: LiteralString = "(VALUES (CAST(:queue AS text)))"

# A worker of one queue (the usual case).
CLAIM = _sql("WITH RECURSIVE " + _claim_ctes(_ONE_QUEUE) + _CLAIMED + _ORDER)

# A worker of several queues: the same probes, per queue, merged by the one ordering.
CLAIM_ANY_QUEUE = _sql(
    "WITH RECURSIVE " + _claim_ctes("unnest(CAST(:queues AS text[]))") + _CLAIMED + _ORDER
)

# Adoption only, of one queue (sync mode: an API process takes over the sync runs of its
# engine whose owner is gone). A lease that ran out counts as cleared, so no reaper is needed
# between the dead owner and the adopter; the new token fences the old owner all the same.
ADOPT = _sql(
    "WITH RECURSIVE "
    + _claim_ctes(
        _ONE_QUEUE,
        "queue = :queue AND (locked_until IS NULL OR locked_until < {NOW})",
        "false",
    )
    + _CLAIMED
    + _ORDER
)


HEARTBEAT = _sql(
    """
    UPDATE tool_run_jobs
    SET locked_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
        updated_at = {NOW}
    WHERE id = :job_id AND lease_token = :token AND status = 'running'
    RETURNING locked_until, cancel_requested_at, {NOW} AS db_now
    """
)


# Asked right before a Docker action: is this lease still ours and unexpired? A plain read
# takes no row lock, so it never waits behind a writer; the connection's statement timeout
# bounds it.
LEASE_HELD = _sql(
    """
    SELECT 1 AS held FROM tool_run_jobs
    WHERE id = :job_id AND lease_token = :token AND status = 'running'
      AND locked_until > {NOW}
    """
)


# A run event on behalf of the attempt (``AttemptControl.note``), fenced like every owner
# write: a worker that lost its lease records nothing.
RECORD_EVENT = _sql(
    """
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, :type,
           CAST(:data AS jsonb) || jsonb_build_object('attempt', attempts)
    FROM tool_run_jobs
    WHERE id = :job_id AND lease_token = :token AND status = 'running'
    RETURNING id
    """
)


_FINALIZE_CTES: LiteralString = """
    done AS (
        UPDATE tool_run_jobs
        SET status = CAST(:status AS run_status), locked_by = NULL, locked_until = NULL,
            lease_token = NULL, finished_at = {NOW}, updated_at = {NOW}, last_error = :error
        WHERE id = :job_id AND lease_token = :token AND status = 'running'
        RETURNING run_id, attempts
    ), done_run AS (
        UPDATE tool_runs r
        SET status = CAST(:status AS run_status), finished_at = {NOW}, attempts = done.attempts,
            exit_code = :exit_code, result = CAST(:result AS jsonb),
            stdout = :stdout, stderr = :stderr,
            stdout_truncated = :stdout_truncated, stderr_truncated = :stderr_truncated,
            error_code = :error_code, error = :error,
            image_digest = coalesce(:image_digest, r.image_digest),
            artifact_set = CAST(:artifact_set AS uuid)
        FROM done WHERE r.id = done.run_id
    ), done_event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'status',
               jsonb_build_object('status', CAST(:status AS text), 'attempt', attempts,
                                  'exit_code', CAST(:exit_code AS integer),
                                  'error_code', CAST(:error_code AS text))
        FROM done
    ), done_notify AS MATERIALIZED (
        SELECT run_id, pg_notify('runyard_runs', CAST(run_id AS text)) FROM done
    )
"""

FINALIZE = _sql("WITH " + _FINALIZE_CTES + "SELECT run_id FROM done_notify")


# The rows of a finalize that also claims: part 0 says which finalizes applied
# (``{FINALIZED}``, from ``done_notify``), part 1 the claimed jobs in claim order.
_FINALIZED_THEN_CLAIMED: LiteralString = (
    """
    SELECT * FROM (
        SELECT 0 AS part, {FINALIZED} AS finalized,
               NULL::uuid AS id, NULL::uuid AS run_id, NULL::integer AS attempts,
               NULL::integer AS max_attempts, NULL::uuid AS lease_token,
               NULL::timestamptz AS locked_until, NULL::timestamptz AS deadline_at,
               NULL::timestamptz AS cancel_requested_at,
               NULL::timestamptz AS container_requested_at, NULL::boolean AS adopted,
               NULL::timestamptz AS started_at, NULL::timestamptz AS requested_at,
               NULL::jsonb AS spec, NULL::jsonb AS input, NULL::jsonb AS deps,
               NULL::jsonb AS dep_artifacts,
               NULL::integer AS priority, NULL::timestamptz AS created_at
        {FROM}
        UNION ALL
        SELECT 1, NULL, c.id, c.run_id, c.attempts, c.max_attempts, c.lease_token,
               c.locked_until, c.deadline_at, c.cancel_requested_at,
               c.container_requested_at, c.adopted, c.started_at, r.requested_at, r.spec,
               r.input,"""
    + _DEPS
    + """, c.priority, c.created_at
        FROM claimed c CROSS JOIN LATERAL (
            SELECT requested_at, spec, input FROM tool_runs WHERE id = c.run_id
        ) r
    ) rows
    ORDER BY part, finalized, adopted DESC, priority DESC, created_at
    """
)

# A slot that finishes an attempt claims its next job (of its one queue) in the same
# statement: one commit fewer per job. The finalize stays fenced by its own lease token; the
# first row says whether it applied, the claimed jobs (if any) follow in claim order.
FINALIZE_AND_CLAIM = _sql(
    "WITH RECURSIVE "
    + _FINALIZE_CTES
    + ", "
    + _claim_ctes(_ONE_QUEUE)
    + _FINALIZED_THEN_CLAIMED.replace(
        "{FINALIZED}", "(SELECT count(*) FROM done_notify) = 1"
    ).replace("{FROM}", "")
)


# A job back in the queue that waits for a build wakes the build rounds: the engine that had
# its build may be the one that died (``worker.builds``).
_REQUEUED_BUILD_NOTIFY: LiteralString = """CASE WHEN status = 'queued' AND build_tag <> ''
                THEN pg_notify('runyard_builds', queue) END AS build_notified"""

# A lost attempt goes back to the queue with backoff while attempts remain, else fails.
# Equal jitter keeps the delay growing with the attempt number: [b/2, b] * 2^(n-1).
REQUEUE = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                          WHEN attempts < max_attempts THEN 'queued'
                          ELSE 'failed' END::run_status,
            available_at = {NOW} + make_interval(secs => LEAST(
                CAST(:backoff_max AS double precision),
                CAST(:backoff_base AS double precision) * power(2, GREATEST(attempts - 1, 0))
            ) * (0.5 + random() / 2)),
            locked_by = NULL, locked_until = NULL, lease_token = NULL, engine_id = NULL,
            deadline_at = NULL,
            finished_at = CASE WHEN cancel_requested_at IS NULL AND attempts < max_attempts
                               THEN NULL ELSE {NOW} END,
            last_error = :error, updated_at = {NOW}
        WHERE id = :job_id AND status = 'running'
          AND (lease_token = :token OR (CAST(:token AS uuid) IS NULL AND locked_until IS NULL))
        RETURNING run_id, status, attempts, max_attempts, available_at, queue, build_tag
    ), run AS (
        UPDATE tool_runs r
        SET status = job.status, attempts = job.attempts,
            finished_at = CASE WHEN job.status = 'queued' THEN NULL ELSE {NOW} END,
            error_code = CASE job.status WHEN 'queued' THEN NULL
                              WHEN 'cancelled' THEN 'cancelled' ELSE :error_code END,
            error = CASE job.status WHEN 'queued' THEN NULL
                         WHEN 'cancelled' THEN 'cancelled while its container was lost'
                         ELSE :error END
        FROM job WHERE r.id = job.run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT job.run_id, {NOW}, e.type, e.data FROM job
        CROSS JOIN LATERAL (VALUES
            ('requeued', CASE WHEN job.status = 'queued' THEN jsonb_build_object(
                'attempt', job.attempts, 'available_at', job.available_at,
                'error_code', CAST(:error_code AS text)) END),
            ('status', jsonb_build_object('status', CAST(job.status AS text),
                'error_code', CAST(:error_code AS text)))
        ) AS e(type, data)
        WHERE e.data IS NOT NULL
    )
    SELECT run_id, CAST(status AS text) AS status, attempts, available_at,
           pg_notify(CASE WHEN status = 'queued' THEN 'runyard_jobs' ELSE 'runyard_runs' END,
                     CAST(run_id AS text)),
           """
    + _REQUEUED_BUILD_NOTIFY
    + """
    FROM job
    """
)


# The start recorded under a lease still ours and unexpired, as ``LEASE_HELD`` asks it: a row
# back is the database's word that the container may be created now (the owner asks nothing
# more before the create).
MARK_CONTAINER_REQUESTED = _sql(
    """
    UPDATE tool_run_jobs SET container_requested_at = {NOW}, updated_at = {NOW}
    WHERE id = :job_id AND lease_token = :token AND status = 'running'
      AND locked_until > {NOW}
    RETURNING id
    """
)


# An attempt whose tool never ran goes back to the queue, and the attempt it was charged is
# given back (its number is reused: a container left ``created`` under it is removed and made
# anew by the next owner, never adopted as a running twin). ``{WHICH}`` says who may know.
_REQUEUE_UNCHARGED: LiteralString = (
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                          ELSE 'queued' END::run_status,
            attempts = attempts - 1,
            available_at = {NOW} + make_interval(secs => CAST(:delay AS double precision)),
            locked_by = NULL, locked_until = NULL, lease_token = NULL, engine_id = NULL,
            deadline_at = NULL, container_requested_at = NULL, updated_at = {NOW},
            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {NOW} END
        WHERE id = :job_id AND status = 'running' AND {WHICH}
        RETURNING run_id, status, attempts, available_at, queue, build_tag
    ), run AS (
        UPDATE tool_runs r
        SET status = job.status, attempts = job.attempts,
            finished_at = CASE WHEN job.status = 'cancelled' THEN {NOW} END,
            error_code = CASE WHEN job.status = 'cancelled' THEN 'cancelled' END
        FROM job WHERE r.id = job.run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT job.run_id, {NOW}, e.type, e.data FROM job
        CROSS JOIN LATERAL (VALUES
            ('requeued', jsonb_build_object('attempt', job.attempts + 1, 'unstarted', true)),
            ('status', jsonb_build_object('status', CAST(job.status AS text)))
        ) AS e(type, data)
    )
    SELECT run_id, CAST(status AS text) AS status, attempts, available_at,
           pg_notify(CASE WHEN status = 'queued' THEN 'runyard_jobs' ELSE 'runyard_runs' END,
                     CAST(run_id AS text)),
           """
    + _REQUEUED_BUILD_NOTIFY
    + """
    FROM job
"""
)

# No container was ever asked for (a crash before the start): the lease holder, or the
# reaper once the lease is cleared, puts the run back at once (``:delay`` 0).
REQUEUE_UNSTARTED = _sql(
    _REQUEUE_UNCHARGED.replace(
        "{WHICH}",
        """container_requested_at IS NULL
          AND (lease_token = :token OR (CAST(:token AS uuid) IS NULL AND locked_until IS NULL))""",
    )
)

# The container was asked for, but its start never was (the runner asks its owner before
# each): only the lease holder knows that, so only it may give the attempt back.
REQUEUE_NEVER_STARTED = _sql(_REQUEUE_UNCHARGED.replace("{WHICH}", "lease_token = :token"))


RELEASE = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET locked_by = NULL, locked_until = NULL, lease_token = NULL, updated_at = {NOW}
        WHERE id = :job_id AND lease_token = :token AND status = 'running'
        RETURNING run_id, attempts
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, 'released', jsonb_build_object('attempt', attempts) FROM job
    RETURNING run_id
    """
)


# Engine trouble: the lease goes back, but no worker adopts the run before :delay seconds
# (``available_at`` of a running job means "adoptable from"), so a worker whose engine keeps
# failing writes one release per delay, not a release and an adoption per poll.
RELEASE_LATER = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET locked_by = NULL, locked_until = NULL, lease_token = NULL,
            available_at = {NOW} + make_interval(secs => CAST(:delay AS double precision)),
            updated_at = {NOW}
        WHERE id = :job_id AND lease_token = :token AND status = 'running'
        RETURNING run_id, attempts, available_at
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, 'released',
           jsonb_build_object('attempt', attempts, 'reason', CAST(:reason AS text),
                              'adoptable_at', available_at)
    FROM job
    RETURNING run_id
    """
)


# A queued run (``{WHICH}``: which ones) ends cancelled at once, its waiters woken.
_CANCEL_QUEUED: LiteralString = """
    WITH job AS (
        UPDATE tool_run_jobs
        SET status = 'cancelled', cancel_requested_at = {NOW}, finished_at = {NOW},
            updated_at = {NOW}
        WHERE {WHICH} AND status = 'queued'
        RETURNING run_id
    ), run AS (
        UPDATE tool_runs r SET status = 'cancelled', finished_at = {NOW},
                               error_code = 'cancelled', error = {WHY}
        FROM job WHERE r.id = job.run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'status', jsonb_build_object('status', 'cancelled') FROM job
    )
    SELECT run_id, pg_notify('runyard_runs', CAST(run_id AS text)) FROM job
"""

# A running run (``{WHICH}``) is flagged; its owner sees it at its next heartbeat, or at once
# through the NOTIFY.
_CANCEL_RUNNING: LiteralString = """
    WITH job AS (
        UPDATE tool_run_jobs
        SET cancel_requested_at = coalesce(cancel_requested_at, {NOW}), updated_at = {NOW}
        WHERE {WHICH} AND status = 'running'
        RETURNING id, run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'cancel_requested', '{}'::jsonb FROM job
    )
    SELECT id, pg_notify('runyard_cancel', CAST(id AS text)) FROM job
"""

_ONE_RUN: LiteralString = "run_id = :run_id"
# A batch's runs, all at once: its queued runs' dependents in the batch are cancelled by the
# same statement, so none of them ends dependency_failed.
_BATCH_RUNS: LiteralString = "run_id IN (SELECT id FROM tool_runs WHERE batch_id = :batch_id)"

CANCEL_QUEUED = _sql(
    _CANCEL_QUEUED.replace("{WHICH}", _ONE_RUN).replace("{WHY}", "'cancelled before it started'")
)
CANCEL_RUNNING = _sql(_CANCEL_RUNNING.replace("{WHICH}", _ONE_RUN))
CANCEL_BATCH_QUEUED = _sql(
    _CANCEL_QUEUED.replace("{WHICH}", _BATCH_RUNS).replace("{WHY}", "'its batch was cancelled'")
)
CANCEL_BATCH_RUNNING = _sql(_CANCEL_RUNNING.replace("{WHICH}", _BATCH_RUNS))

# A batch's cancel, in one transaction: its running jobs first, then its queued ones. Every
# statement that ends a run locks in that order too: a finalize (or a requeue, a cancel of a
# run) locks the run's running job, then the trigger of migration 0011 locks its queued
# dependents' jobs. Queued first here would let a finalize of one of the batch's runs hold
# its running job while waiting for a queued dependent this cancel holds, and this cancel
# wait for that running job: a deadlock (Postgres aborts one of the two with 40P01).
CANCEL_BATCH = (CANCEL_BATCH_RUNNING, CANCEL_BATCH_QUEUED)


# Fenced like every owner write: a worker that lost its lease cannot repeat log lines.
APPEND_LOG = _sql(
    """
    WITH job AS (
        SELECT run_id, attempts FROM tool_run_jobs
        WHERE id = :job_id AND lease_token = :token AND status = 'running'
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, :stream,
           jsonb_build_object('attempt', attempts, 'text', CAST(:text AS text),
                              'until', CAST(:until AS text))
    FROM job
    RETURNING run_id
    """
)


# "Last" in the order readers deliver events (runyard.reads.events_sql), not the largest id.
LAST_LOG_POSITION = _sql(
    """
    SELECT data->>'until' FROM tool_run_events
    WHERE run_id = :run_id AND type = :stream AND (data->>'attempt')::int = :attempt
    ORDER BY xact_id DESC, id DESC LIMIT 1
    """
)


JOB_PRIORITY = _sql("SELECT priority FROM tool_run_jobs WHERE run_id = :run_id")


RUN_STATUS = _sql("SELECT CAST(status AS text) FROM tool_runs WHERE id = :run_id")


SELECT_EXPIRED = _sql(
    """
    SELECT id FROM tool_run_jobs
    WHERE status = 'running' AND locked_until < {NOW}
    ORDER BY locked_until
    LIMIT :batch
    """
)


# The condition is re-checked inside the UPDATE: a row finalized or renewed after it was
# selected is left alone, and of two reapers only one clears each lease.
CLEAR_EXPIRED = _sql(
    """
    WITH cleared AS (
        UPDATE tool_run_jobs
        SET locked_by = NULL, locked_until = NULL, lease_token = NULL, updated_at = {NOW}
        WHERE id = ANY(CAST(:job_ids AS uuid[]))
          AND status = 'running' AND locked_until < {NOW}
        RETURNING id, run_id, attempts
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, 'lease_expired', jsonb_build_object('attempt', attempts)
    FROM cleared
    RETURNING run_id
    """
)


# Adoptable jobs whose engine has had no live worker for :dead_after seconds, with the facts
# the adoption rule needs (``runyard.domain.adoption``).
SELECT_ORPHANED = _sql(
    """
    SELECT j.id, j.run_id, j.container_requested_at IS NOT NULL AS container_requested,
           j.cancel_requested_at IS NOT NULL AS cancel_requested,
           j.attempts < j.max_attempts AS attempts_left,
           coalesce(j.deadline_at <= {NOW}, false) AS deadline_passed
    FROM tool_run_jobs j
    WHERE j.status = 'running' AND j.locked_until IS NULL
      AND j.updated_at < {NOW} - make_interval(secs => CAST(:dead_after AS double precision))
      AND NOT EXISTS (
          SELECT 1 FROM workers w
          WHERE w.engine_id = j.engine_id AND w.stopped_at IS NULL
            AND w.last_seen_at >= {NOW} - make_interval(
                secs => CAST(:dead_after AS double precision))
      )
    ORDER BY j.updated_at
    LIMIT :batch
    """
)


# Retention: up to :batch runs (either mode) terminal for longer than :retention seconds,
# oldest first, deleted with everything that belongs to them (their job, events, edges and
# webhook deliveries go by ON DELETE CASCADE). A run that queued or running runs depend on
# stays until they end: what it returned is their /runyard/deps.json. Terminal runs never
# change again, and the per-tenant counts (migration 0006) only count queued and running
# ones, so they stay exact. A run whose webhook is still being retried stays until its
# delivery ends. SKIP LOCKED: reapers running
# at once take different runs.
PRUNE = _sql(
    """
    WITH old AS MATERIALIZED (
        SELECT r.id FROM tool_runs r
        WHERE r.status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
          AND r.finished_at < {NOW} - make_interval(secs => CAST(:retention AS double precision))
          AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                          WHERE d.run_id = r.id AND d.status = 'pending')
          AND NOT (r.has_dependents AND EXISTS (
              SELECT 1 FROM tool_run_deps e JOIN tool_runs w ON w.id = e.run_id
              WHERE e.depends_on = r.id AND w.status IN ('queued', 'running')))
        ORDER BY r.finished_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM tool_runs r USING old WHERE r.id = old.id
    RETURNING r.id
    """
)

# Batches older than the retention whose runs are all gone (runs keep their batch row).
PRUNE_BATCHES = _sql(
    """
    WITH old AS MATERIALIZED (
        SELECT b.id FROM batches b
        WHERE b.created_at < {NOW} - make_interval(secs => CAST(:retention AS double precision))
          AND NOT EXISTS (SELECT 1 FROM tool_runs r WHERE r.batch_id = b.id)
        ORDER BY b.created_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM batches b USING old WHERE b.id = old.id
    RETURNING b.id
    """
)


# The queued runs of every tenant, from their count rows (up to 16 of each tenant that ever
# had a run, kept at zero): a deep queue costs no more than a shallow one. Counting the
# queued jobs themselves, even stopped at the cap, read every entry up to it: 20-30 ms at
# 60,000 queued, for every submit near the cap.
QUEUE_DEPTH = _sql("SELECT coalesce(sum(queued), 0) FROM tenant_run_counts")
