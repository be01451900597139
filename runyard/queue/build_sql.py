"""The named SQL statements of builds (``runyard.queue.builds``), one per operation.

A build is one row of ``tool_builds`` per digest (``tag``) and engine, leased to a worker of
that engine like a job: claimed with a fresh ``lease_token``, renewed, and every later write
fenced by ``(id, lease_token)``. ``{NOW}`` is the injected clock or the database's ``now()``.
"""

from __future__ import annotations

from typing import LiteralString

from sqlalchemy import TextClause

from runyard.queue.sql import _sql

# Kept once per tag: the first submit that names a digest saves its source.
SAVE_CONTEXT = _sql(
    """
    INSERT INTO tool_build_contexts (tag, tool, digest, dockerfile, args, network,
                                     timeout_seconds, size, context, created_at)
    VALUES (:tag, :tool, :digest, :dockerfile, CAST(:args AS jsonb), :network,
            :timeout_seconds, :size, :context, {NOW})
    ON CONFLICT (tag) DO NOTHING
    """
)


# The builds that queued runs wait for, one probe each (a skip scan of
# ``ix_tool_run_jobs_queued_build``), however many runs wait.
_WAITED_FOR: LiteralString = """
    waited (tag) AS (
        (SELECT build_tag FROM tool_run_jobs
         WHERE status = 'queued' AND build_tag <> '' ORDER BY build_tag LIMIT 1)
        UNION ALL
        SELECT (SELECT build_tag FROM tool_run_jobs
                WHERE status = 'queued' AND build_tag <> '' AND build_tag > w.tag
                ORDER BY build_tag LIMIT 1)
        FROM waited w WHERE w.tag IS NOT NULL
    )
"""

# A worker queues the builds its engine lacks for the queued runs of its queues. A digest
# whose build failed on any engine is not built again until an admin asks (REBUILD).
REQUEST_BUILDS = _sql(
    "WITH RECURSIVE "
    + _WAITED_FOR
    + """, wanted AS (
        SELECT w.tag FROM waited w
        WHERE w.tag IS NOT NULL
          AND EXISTS (SELECT 1 FROM tool_run_jobs j
                      WHERE j.status = 'queued' AND j.build_tag <> '' AND j.build_tag = w.tag
                        AND j.queue = ANY(CAST(:queues AS text[])))
          AND NOT EXISTS (SELECT 1 FROM tool_builds b
                          WHERE b.tag = w.tag
                            AND (b.engine_id = :engine_id OR b.status = 'failed'))
    ), made AS (
        INSERT INTO tool_builds (id, tag, tool, digest, engine_id, max_attempts, available_at,
                                 created_at, updated_at)
        SELECT gen_random_uuid(), c.tag, c.tool, c.digest, :engine_id, :max_attempts, {NOW},
               {NOW}, {NOW}
        FROM wanted w JOIN tool_build_contexts c ON c.tag = w.tag
        ON CONFLICT (tag, engine_id) DO NOTHING
        RETURNING id, tag
    )
    SELECT id, tag FROM made
    """
)


# Whether a worker's build round has anything to do: a queued run waits for a digest (in any
# queue: FAIL_WAITING fails every queue's; REQUEST_BUILDS looks at the worker's own), or a
# build of this engine is due or orphaned (CLAIM_BUILD's predicate). One probe of each
# partial index; a round that finds neither skips those three statements.
BUILD_WORK = _sql(
    """
    SELECT EXISTS (SELECT 1 FROM tool_run_jobs
                   WHERE status = 'queued' AND build_tag <> '')
        OR EXISTS (SELECT 1 FROM tool_builds
                   WHERE engine_id = :engine_id AND status IN ('queued', 'building')
                     AND ((status = 'queued' AND available_at <= {NOW})
                          OR (status = 'building' AND locked_until < {NOW}))) AS pending
    """
)


# One build of this engine: a queued one that is due, or one whose lease ran out (its worker
# died: the new holder adopts the image if the engine has it, else builds again). Oldest
# first; SKIP LOCKED, so workers of one engine never take the same row.
CLAIM_BUILD = _sql(
    """
    WITH pick AS MATERIALIZED (
        SELECT id, status AS was FROM tool_builds
        WHERE engine_id = :engine_id
          AND ((status = 'queued' AND available_at <= {NOW})
               OR (status = 'building' AND locked_until < {NOW}))
        ORDER BY created_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    UPDATE tool_builds b SET
        status = 'building',
        attempts = b.attempts + 1,
        locked_by = :worker_id,
        locked_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
        lease_token = gen_random_uuid(),
        started_at = {NOW},
        first_started_at = coalesce(b.first_started_at, {NOW}),
        deadline_at = {NOW} + make_interval(secs => c.timeout_seconds),
        updated_at = {NOW}
    FROM pick, tool_build_contexts c
    WHERE b.id = pick.id AND c.tag = b.tag
    RETURNING b.id, b.tag, b.tool, b.digest, b.engine_id, b.attempts, b.max_attempts,
              b.lease_token, b.deadline_at, pick.was = 'building' AS recovered,
              c.dockerfile, c.args, c.network, c.timeout_seconds, c.context
    """
)


HEARTBEAT_BUILD = _sql(
    """
    UPDATE tool_builds
    SET locked_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
        updated_at = {NOW}
    WHERE id = :build_id AND lease_token = :token AND status = 'building'
    RETURNING locked_until
    """
)


# The log keeps its last :cap characters; ``log_size`` counts every one ever appended, so a
# follower knows what it has not seen yet.
APPEND_BUILD_LOG = _sql(
    """
    UPDATE tool_builds
    SET log = right(log || :text, :cap), log_size = log_size + length(:text),
        updated_at = {NOW}
    WHERE id = :build_id AND lease_token = :token AND status = 'building'
    RETURNING log_size
    """
)


BUILD_READY = _sql(
    """
    WITH done AS (
        UPDATE tool_builds
        SET status = 'ready', image_id = :image_id, error = NULL, finished_at = {NOW},
            updated_at = {NOW}, locked_by = NULL, locked_until = NULL, lease_token = NULL,
            traceparent = CAST(:traceparent AS text)
        WHERE id = :build_id AND lease_token = :token AND status = 'building'
        RETURNING tag
    ), woken AS MATERIALIZED (
        SELECT pg_notify('runyard_jobs', q.queue) FROM (
            SELECT DISTINCT queue FROM tool_run_jobs
            WHERE status = 'queued' AND build_tag <> ''
              AND build_tag = (SELECT tag FROM done)
        ) q
    )
    SELECT (SELECT count(*) FROM done) AS done, (SELECT count(*) FROM woken) AS woken
    """
)


# The queued runs of a digest whose build failed, failed with ``build_failed`` and the
# build's error (its log's tail), unless an engine has that digest ready (they run there).
# ``{TAG}`` is the digest's tag, ``{ERROR}`` the message, ``{WHEN}`` a further condition.
_FAIL_WAITING_CTES: LiteralString = """
    waiting AS (
        UPDATE tool_run_jobs j
        SET status = 'failed', finished_at = {NOW}, updated_at = {NOW},
            last_error = 'build_failed'
        WHERE j.status = 'queued' AND j.build_tag <> '' AND j.build_tag = {TAG} AND {WHEN}
          AND NOT EXISTS (SELECT 1 FROM tool_builds r
                          WHERE r.tag = j.build_tag AND r.status = 'ready')
        RETURNING j.run_id, j.build_tag
    ), waiting_run AS (
        UPDATE tool_runs r
        SET status = 'failed', finished_at = {NOW}, error_code = 'build_failed', error = {ERROR}
        FROM waiting w WHERE r.id = w.run_id
    ), waiting_event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'status',
               jsonb_build_object('status', 'failed', 'error_code', 'build_failed')
        FROM waiting
    ), waiting_notify AS MATERIALIZED (
        SELECT pg_notify('runyard_runs', CAST(run_id AS text)) FROM waiting
    )
"""


def _fail_waiting(tag: LiteralString, error: LiteralString, when: LiteralString) -> LiteralString:
    return (
        _FAIL_WAITING_CTES.replace("{TAG}", tag).replace("{ERROR}", error).replace("{WHEN}", when)
    )


# The build failed (its Dockerfile, its timeout, its attempts spent): fenced, and the runs
# waiting for it fail in the same statement.
BUILD_FAILED = _sql(
    """
    WITH done AS (
        UPDATE tool_builds
        SET status = 'failed', error = :error, finished_at = {NOW}, updated_at = {NOW},
            locked_by = NULL, locked_until = NULL, lease_token = NULL
        WHERE id = :build_id AND lease_token = :token AND status = 'building'
        RETURNING tag
    ), """
    + _fail_waiting("(SELECT tag FROM done)", "CAST(:error AS text)", "true")
    + """
    SELECT (SELECT count(*) FROM done) AS done, (SELECT count(*) FROM waiting_notify) AS failed
    """
)

_FAILED_ERROR: LiteralString = """(SELECT f.error FROM tool_builds f
        WHERE f.tag = w.build_tag AND f.status = 'failed' ORDER BY f.finished_at DESC LIMIT 1)"""

# Runs that reached a failed digest after its failure was written (a submit racing the
# failure, or any submit until an admin asks for a rebuild) fail the same way. ``:tag`` NULL:
# every digest queued runs wait for (the workers' sweep).
FAIL_WAITING = _sql(
    "WITH RECURSIVE "
    + _WAITED_FOR
    + ", failed AS MATERIALIZED (SELECT w.tag FROM waited w WHERE w.tag IS NOT NULL"
    + " AND (CAST(:tag AS text) IS NULL OR w.tag = :tag)"
    + " AND EXISTS (SELECT 1 FROM tool_builds f WHERE f.tag = w.tag AND f.status = 'failed')),"
    + _fail_waiting(
        "ANY(ARRAY(SELECT tag FROM failed))",
        _FAILED_ERROR,
        "true",
    )
    + "SELECT count(*) AS failed FROM waiting_notify"
)


# The worker cannot build now (its engine stopped answering, or it is stopping): the build
# goes back to the queue, its attempt given back, due again after :delay seconds.
RELEASE_BUILD = _sql(
    """
    UPDATE tool_builds
    SET status = 'queued', attempts = attempts - 1, locked_by = NULL, locked_until = NULL,
        lease_token = NULL, deadline_at = NULL,
        available_at = {NOW} + make_interval(secs => CAST(:delay AS double precision)),
        updated_at = {NOW}
    WHERE id = :build_id AND lease_token = :token AND status = 'building'
    RETURNING id
    """
)


# An admin asks for a digest's build ahead of runs, or again after a failure: failed rows
# (and with :force, ready ones) are queued again; engines with a live worker of the tool's
# queue that have no row get one. Workers are woken, their build rounds too.
REBUILD = _sql(
    """
    WITH engines AS (
        SELECT DISTINCT engine_id FROM workers
        WHERE stopped_at IS NULL AND CAST(:queue AS text) = ANY(queues)
          AND last_seen_at >= {NOW} - make_interval(secs => CAST(:live AS double precision))
    ), again AS (
        UPDATE tool_builds
        SET status = 'queued', attempts = 0, error = NULL, image_id = NULL,
            finished_at = NULL, first_started_at = NULL, available_at = {NOW},
            updated_at = {NOW}
        WHERE tag = :tag AND (status = 'failed' OR (:force AND status = 'ready'))
        RETURNING id
    ), made AS (
        INSERT INTO tool_builds (id, tag, tool, digest, engine_id, max_attempts, available_at,
                                 created_at, updated_at)
        SELECT gen_random_uuid(), c.tag, c.tool, c.digest, e.engine_id, :max_attempts, {NOW},
               {NOW}, {NOW}
        FROM engines e JOIN tool_build_contexts c ON c.tag = :tag
        ON CONFLICT (tag, engine_id) DO NOTHING
        RETURNING id
    )
    SELECT (SELECT count(*) FROM again) AS again, (SELECT count(*) FROM made) AS made,
           pg_notify('runyard_jobs', CAST(:queue AS text)) AS woken,
           pg_notify('runyard_builds', CAST(:queue AS text)) AS builds_woken
    """
)


# What an attempt's build-wait span needs (tracing on only; a run of a built tool only):
# when its run was submitted, when the build it waited for on this engine was ready, and
# that build's span.
BUILD_WAIT = _sql(
    """
    SELECT r.requested_at AS queued_at, b.finished_at, b.traceparent
    FROM tool_runs r, tool_builds b
    WHERE r.id = :run_id AND b.tag = :tag AND b.engine_id = :engine_id AND b.status = 'ready'
    """
)


def statements() -> dict[str, TextClause]:
    """Every build statement by name (tests compile each against Postgres)."""
    return {name: value for name, value in globals().items() if isinstance(value, TextClause)}
