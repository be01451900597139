"""The batched finalize's named statements (``runyard.queue.completer`` sends them): the
finalizes of several slots of one worker in one statement, each fenced on its own."""

from __future__ import annotations

from typing import LiteralString

from runyard.queue.sql import _FINALIZED_THEN_CLAIMED, _ONE_QUEUE, _claim_ctes, _sql

# The finalizes of several slots of one worker in one statement (its batch completer,
# ``runyard.queue.completer``): request ``n`` of the arrays is fenced by its own job id, lease
# token and status exactly as FINALIZE is, and applies or not on its own; a job sent twice is
# finalized by its first request only. ``:limit`` (the requests that want their slot's next
# job) jobs are claimed in the same statement, as FINALIZE_AND_CLAIM claims one.
_FINALIZE_MANY_CTES: LiteralString = """
    outcome AS MATERIALIZED (
        SELECT DISTINCT ON (o.job_id) o.*
        FROM unnest(CAST(:job_ids AS uuid[]), CAST(:tokens AS uuid[]),
                    CAST(:statuses AS text[]), CAST(:exit_codes AS integer[]),
                    CAST(:results AS text[]), CAST(:stdouts AS text[]),
                    CAST(:stderrs AS text[]), CAST(:stdouts_truncated AS boolean[]),
                    CAST(:stderrs_truncated AS boolean[]), CAST(:error_codes AS text[]),
                    CAST(:errors AS text[]), CAST(:image_digests AS text[]),
                    CAST(:artifact_sets AS uuid[]))
             WITH ORDINALITY AS o(job_id, token, status, exit_code, result, stdout, stderr,
                                  stdout_truncated, stderr_truncated, error_code, error,
                                  image_digest, artifact_set, n)
        ORDER BY o.job_id, o.n
    ), done AS (
        UPDATE tool_run_jobs j
        SET status = CAST(o.status AS run_status), locked_by = NULL, locked_until = NULL,
            lease_token = NULL, finished_at = {NOW}, updated_at = {NOW}, last_error = o.error
        FROM outcome o
        WHERE j.id = o.job_id AND j.lease_token = o.token AND j.status = 'running'
        RETURNING j.run_id, j.attempts, o.*
    ), done_run AS (
        UPDATE tool_runs r
        SET status = CAST(d.status AS run_status), finished_at = {NOW}, attempts = d.attempts,
            exit_code = d.exit_code, result = CAST(d.result AS jsonb),
            stdout = d.stdout, stderr = d.stderr,
            stdout_truncated = d.stdout_truncated, stderr_truncated = d.stderr_truncated,
            error_code = d.error_code, error = d.error,
            image_digest = coalesce(d.image_digest, r.image_digest),
            artifact_set = d.artifact_set
        FROM done d WHERE r.id = d.run_id
    ), done_event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'status',
               jsonb_build_object('status', status, 'attempt', attempts,
                                  'exit_code', exit_code, 'error_code', error_code)
        FROM done ORDER BY n
    ), done_notify AS MATERIALIZED (
        SELECT n, run_id, pg_notify('runyard_runs', CAST(run_id AS text)) FROM done
    )
"""

# The requests (by number, from 1) whose finalize applied.
FINALIZE_MANY = _sql("WITH " + _FINALIZE_MANY_CTES + "SELECT n FROM done_notify")

# FINALIZE_MANY and a claim of ``:limit`` jobs: part 0 rows name each request that applied
# (``finalized`` is its number), part 1 rows are the claimed jobs in claim order.
FINALIZE_MANY_AND_CLAIM = _sql(
    "WITH RECURSIVE "
    + _FINALIZE_MANY_CTES
    + ", "
    + _claim_ctes(_ONE_QUEUE)
    + _FINALIZED_THEN_CLAIMED.replace("{FINALIZED}", "CAST(n AS integer)").replace(
        "{FROM}", "FROM done_notify"
    )
)
