"""The named statements of a graph submit (runs with dependencies or a start time, batches).

They run in one transaction, in this order: ``INSERT_BATCH`` (batches), ``LOCK_DEPENDENCIES``,
``ADMIT_MANY``, ``INSERT_GRAPH``. The trigger of migration 0011 settles dependents when runs
end; the claim (``runyard.queue.sql``) takes only jobs that wait for nothing.
"""

from __future__ import annotations

from runyard.queue.sql import TENANT_COUNTS_CTES, WINDOW_RETRY_AFTER, _sql

INSERT_BATCH = _sql(
    """
    INSERT INTO batches (id, tenant, created_at, size, idempotency_key, request_hash)
    VALUES (:id, :tenant, {NOW}, :size, :idempotency_key, :request_hash)
    ON CONFLICT (tenant, idempotency_key) DO NOTHING
    RETURNING id
    """
)

FIND_BATCH_IDEMPOTENT = _sql(
    "SELECT id, request_hash FROM batches WHERE tenant = :tenant AND idempotency_key = :key"
)


# The existing runs the new ones depend on, locked in id order until the commit, and marked
# as depended on. The lock orders this submit with their ends: a run that ends before it is
# taken here shows its final status (a lock waited for reads the row's newest version); one
# that ends after waits for this commit, and the trigger it fires then sees the new edges.
# Another tenant's run is not returned: to the caller it does not exist.
LOCK_DEPENDENCIES = _sql(
    """
    WITH locked AS MATERIALIZED (
        SELECT id FROM tool_runs
        WHERE id = ANY(CAST(:ids AS uuid[])) AND tenant = :tenant
        ORDER BY id
        FOR NO KEY UPDATE
    )
    UPDATE tool_runs r SET has_dependents = true
    FROM locked WHERE r.id = locked.id
    RETURNING r.id, CAST(r.status AS text) AS status, r.error_code, r.ref
    """
)


# Admission of ``:n`` runs at once, under the lock of the tenant's row 0 (as ``SUBMIT``): all
# fit under the queued, created and stored caps, or none is written. Runs written failed (a
# dependency had failed) count in ``:n`` like the others.
ADMIT_MANY = _sql(
    "WITH "
    + TENANT_COUNTS_CTES
    + """
    SELECT CASE WHEN 0 < :queued_cap AND :queued_cap < queued + :n THEN 'tenant_queued'
                WHEN 0 < :running_cap AND :running_cap <= running THEN 'tenant_running'
                WHEN 0 < :created_cap AND :created_cap < created + :n THEN 'tenant_created'
                WHEN 0 < :stored_cap AND :stored_cap < stored + :n THEN 'tenant_stored'
           END AS refused,
           """
    + WINDOW_RETRY_AFTER
    + """ AS window_retry_after
    FROM active
    """
)


# Every run of the graph with its job, its edges and its first events, from JSON documents:
# ``:items``, one object per run, whose spec is an index into ``:specs`` (the distinct specs:
# a batch of one tool sends its spec once), and ``:edges``, pairs of run ids. JSON, not
# parallel arrays: the driver escapes every element of a text array in Python, which cost
# more than the insert. A
# run whose dependency already ended without success is written failed (``error``); the others
# queued, waiting for ``waiting_on`` dependencies, claimable from ``run_at`` (a past time means
# now). A single run's Idempotency-Key that was used before writes nothing (``inserted`` 0):
# the caller reads the replay. ``requested_at`` is the time written on the runs. A run a
# schedule fires names its slot (``schedule_id``, ``schedule_slot``): the unique index on the
# pair refuses a second run of one slot.
INSERT_GRAPH = _sql(
    """
    WITH spec AS MATERIALIZED (
        SELECT CAST(s.n AS integer) - 1 AS n, s.spec
        FROM jsonb_array_elements(CAST(:specs AS jsonb)) WITH ORDINALITY AS s(spec, n)
    ), item AS MATERIALIZED (
        SELECT t.run_id, gen_random_uuid() AS job_id, t.tool, spec.spec, t.input, t.queue,
               t.priority, t.max_attempts, t.timeout_seconds, t.ref, t.run_at, t.waiting_on,
               t.error, t.callback_url, t.request_hash, t.rerun_of, t.has_dependents,
               t.schedule_id, t.schedule_slot, t.concurrency_key, t.flow_scopes
        FROM json_to_recordset(CAST(:items AS json)) AS t(
            run_id uuid, tool text, spec integer, input jsonb, queue text, priority integer,
            max_attempts integer, timeout_seconds integer, ref text, run_at timestamptz,
            waiting_on integer, error text, callback_url text, request_hash text,
            rerun_of uuid, has_dependents boolean, schedule_id uuid, schedule_slot timestamptz,
            concurrency_key text, flow_scopes text[])
        JOIN spec ON spec.n = t.spec
    ), edge AS MATERIALIZED (
        SELECT CAST(e ->> 0 AS uuid) AS run_id, CAST(e ->> 1 AS uuid) AS depends_on
        FROM json_array_elements(CAST(:edges AS json)) AS e
    ), run AS (
        INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at,
                               finished_at, attempts, max_attempts, idempotency_key,
                               request_hash, callback_url, error_code, error, batch_id, ref,
                               rerun_of, run_at, has_dependents, schedule_id, schedule_slot,
                               concurrency_key)
        SELECT i.run_id, :tenant, i.tool, i.spec, i.input,
               CASE WHEN i.error IS NULL THEN 'queued' ELSE 'failed' END::run_status,
               'queue', {NOW}, CASE WHEN i.error IS NOT NULL THEN {NOW} END, 0,
               i.max_attempts, CAST(:idempotency_key AS text), i.request_hash,
               i.callback_url,
               CASE WHEN i.error IS NOT NULL THEN 'dependency_failed' END, i.error,
               CAST(:batch_id AS uuid), i.ref, i.rerun_of, i.run_at,
               i.has_dependents, i.schedule_id, i.schedule_slot, i.concurrency_key
        FROM item i
        ON CONFLICT (tenant, idempotency_key) DO NOTHING
        RETURNING id, status
    ), job AS (
        INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, priority, attempts,
                                   max_attempts, timeout_seconds, available_at, created_at,
                                   updated_at, finished_at, waiting_on, last_error, build_tag,
                                   flow_scopes)
        SELECT i.job_id, i.run_id, run.status, i.queue, :tenant, i.priority, 0,
               i.max_attempts, i.timeout_seconds,
               -- Held until a flow gate releases it (no sooner than its run_at).
               CASE WHEN i.flow_scopes IS NULL THEN GREATEST({NOW}, coalesce(i.run_at, {NOW}))
                    ELSE CAST('infinity' AS timestamptz) END,
               {NOW}, {NOW}, CASE WHEN i.error IS NOT NULL THEN {NOW} END, i.waiting_on,
               CASE WHEN i.error IS NOT NULL THEN 'dependency_failed' END,
               coalesce(i.spec #>> '{build,tag}', ''), i.flow_scopes
        FROM item i JOIN run ON run.id = i.run_id
        RETURNING run_id, queue, status, waiting_on, available_at, flow_scopes, build_tag
    ), deps AS (
        INSERT INTO tool_run_deps (run_id, depends_on)
        SELECT e.run_id, e.depends_on FROM edge e JOIN run ON run.id = e.run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT job.run_id, {NOW}, e.type, e.data
        FROM job CROSS JOIN LATERAL (VALUES
            (1, 'status', jsonb_build_object('status', 'queued')),
            (2, 'waiting', CASE WHEN job.waiting_on > 0
                                     OR job.available_at > {NOW} AND job.available_at < 'infinity'
                THEN jsonb_build_object('dependencies', job.waiting_on,
                                        'run_at', NULLIF(job.available_at, 'infinity')) END),
            (3, 'status', CASE WHEN job.status = 'failed' THEN jsonb_build_object(
                'status', 'failed', 'error_code', 'dependency_failed') END)
        ) AS e(n, type, data)
        WHERE e.data IS NOT NULL
        ORDER BY job.run_id, e.n
    )
    SELECT (SELECT count(*) FROM run) AS inserted, {NOW} AS requested_at,
           (SELECT count(pg_notify('runyard_jobs', q.queue))
            FROM (SELECT DISTINCT queue FROM job
                  WHERE status = 'queued' AND waiting_on = 0) q) AS woken,
           (SELECT count(pg_notify('runyard_held', q.queue))
            FROM (SELECT DISTINCT queue FROM job WHERE flow_scopes IS NOT NULL) q) AS held,
           (SELECT count(pg_notify('runyard_builds', q.queue))
            FROM (SELECT DISTINCT queue FROM job
                  WHERE status = 'queued' AND build_tag <> '') q) AS builds
    """
)


# A batch's retry, in the transaction of its graph submit: the batch is locked (two retries
# at once write one set of runs), and nothing may have re-run the runs it replaces already.
LOCK_BATCH_FOR_RETRY = _sql(
    """
    SELECT b.id,
           EXISTS (SELECT 1 FROM tool_runs r
                   WHERE r.rerun_of = ANY(CAST(:replaced AS uuid[]))) AS already_retried
    FROM batches b WHERE b.id = :batch_id
    FOR UPDATE
    """
)
