"""The named SQL statements of sandboxes, one per operation (read them in ``store.py``).

A sandbox's run and job change state only through ``runyard.queue``; these statements write
what only a sandbox has: its row, its commands (``sandbox_execs``) and their output.
"""

from __future__ import annotations

from sqlalchemy import text

# What only a sandbox has, written after its run by the API and again (no-op) by its owner,
# so a sandbox whose API died between the two statements still gets its row.
INSERT_SANDBOX = text(
    """
    INSERT INTO sandboxes (run_id, tenant, tool, idle_timeout_seconds, max_execs)
    VALUES (:run_id, :tenant, :tool, :idle_timeout_seconds, :max_execs)
    ON CONFLICT (run_id) DO NOTHING
    """
)

# Its owner found the container running with its workspace made: callers may use it now.
MARK_READY = text(
    "UPDATE sandboxes SET ready_at = now() WHERE run_id = :run_id AND ready_at IS NULL"
)

# A caller used the sandbox (an exec, a file read or written): its idle clock starts again.
TOUCH = text("UPDATE sandboxes SET last_active_at = now() WHERE run_id = :run_id")

_VIEW = """
    SELECT s.run_id, s.tenant, s.tool, s.idle_timeout_seconds, s.max_execs, s.last_active_at,
           s.created_at, s.ready_at, s.exec_count, r.status, r.error_code, r.error,
           r.started_at, r.finished_at,
           j.deadline_at, j.engine_id, CAST(r.spec->>'disk_mb' AS integer) AS disk_mb,
           coalesce(r.spec->>'user', '65534:65534') AS container_user, r.attempts AS attempt
    FROM sandboxes s
    JOIN tool_runs r ON r.id = s.run_id
    LEFT JOIN tool_run_jobs j ON j.run_id = s.run_id
"""

# One sandbox as its caller sees it; ``:tenant`` NULL: any tenant's (an admin's read).
SANDBOX_VIEW = text(
    f"""
    {_VIEW}
    WHERE s.run_id = :run_id AND (CAST(:tenant AS text) IS NULL OR s.tenant = :tenant)
    """
)

# A tenant's sandboxes, newest first, a page at a time (the index on (tenant, created_at)).
LIST_SANDBOXES = text(
    f"""
    {_VIEW}
    WHERE s.tenant = :tenant
    ORDER BY s.created_at DESC, s.run_id DESC
    LIMIT :limit
    """
)

# A command for a sandbox that has not ended and has room for it (``exec_count`` below
# ``:max_total``), the sandbox touched and counted and its owner woken
# (``runyard_sandbox_execs``, at the commit), in one statement; no row: the sandbox has ended,
# has had its most commands, or is not there.
INSERT_EXEC = text(
    """
    WITH alive AS (
        SELECT s.run_id FROM sandboxes s JOIN tool_runs r ON r.id = s.run_id
        WHERE s.run_id = :run_id AND r.status IN ('queued', 'running')
    ), counted AS (
        UPDATE sandboxes SET last_active_at = now(), exec_count = exec_count + 1
        WHERE run_id IN (SELECT run_id FROM alive) AND exec_count < :max_total
        RETURNING run_id
    )
    INSERT INTO sandbox_execs (id, run_id, command, stdin, env, cwd, timeout_seconds)
    SELECT :exec_id, a.run_id, CAST(:command AS jsonb), :stdin, CAST(:env AS jsonb), :cwd,
           :timeout_seconds
    FROM counted a,
         LATERAL (SELECT pg_notify('runyard_sandbox_execs', CAST(a.run_id AS text))) woken
    RETURNING id
    """
)

# What the owner of a sandbox looks at each round: its idle clock and its open commands.
OWNER_TICK = text(
    """
    SELECT s.last_active_at, s.idle_timeout_seconds, s.max_execs, now() AS db_now
    FROM sandboxes s WHERE s.run_id = :run_id
    """
)

OPEN_EXECS = text(
    """
    SELECT id, status, command, env, cwd, timeout_seconds, started_at, stdout_end,
           stderr_end, timed_out, octet_length(stdin) > 0 AS has_stdin
    FROM sandbox_execs
    WHERE run_id = :run_id AND status <> 'finished'
    ORDER BY created_at, id
    LIMIT :limit
    """
)

EXEC_STDIN = text("SELECT stdin FROM sandbox_execs WHERE id = :exec_id")

# The owner is about to start the command in the container: from now on an owner that finds
# it ``running`` starts it only if the container never saw it (the wrapper's directory).
MARK_EXEC_RUNNING = text(
    """
    UPDATE sandbox_execs SET status = 'running', started_at = now()
    WHERE id = :exec_id AND status = 'pending'
    RETURNING started_at
    """
)

# Bytes [offset, offset + length) of a stream: stored only if they start exactly where the
# stored bytes end, so two owners (one fenced out but still running) never store a byte twice
# nor leave a gap; zero rows: someone else stored them, read the ends again. Readers waiting
# on the sandbox are woken (``runyard_events`` with its id, as a run's events do).
APPEND_CHUNK = text(
    """
    WITH moved AS (
        UPDATE sandbox_execs
        SET stdout_end = CASE WHEN :stream = 'stdout' THEN :offset + :length ELSE stdout_end END,
            stderr_end = CASE WHEN :stream = 'stderr' THEN :offset + :length ELSE stderr_end END
        WHERE id = :exec_id AND status = 'running'
          AND CASE WHEN :stream = 'stdout' THEN stdout_end ELSE stderr_end END = :offset
        RETURNING id, run_id
    )
    INSERT INTO sandbox_exec_chunks (exec_id, stream, "offset", length, data)
    SELECT m.id, :stream, :offset, :length, :data
    FROM moved m, LATERAL (SELECT pg_notify('runyard_events', CAST(m.run_id AS text))) woken
    RETURNING "offset"
    """
)

EXEC_ENDS = text("SELECT stdout_end, stderr_end FROM sandbox_execs WHERE id = :exec_id")

MARK_EXEC_TIMED_OUT = text(
    "UPDATE sandbox_execs SET timed_out = true WHERE id = :exec_id AND status = 'running'"
)

# The command exited and every byte it wrote (up to the cap) is stored: it ends, once, and
# its readers are woken.
FINISH_EXEC = text(
    """
    UPDATE sandbox_execs
    SET status = 'finished', exit_code = :exit_code, error = :error, truncated = :truncated,
        finished_at = now()
    WHERE id = :exec_id AND status <> 'finished'
    RETURNING id, pg_notify('runyard_events', CAST(run_id AS text)), created_at, started_at,
              finished_at, timed_out
    """
)

# The sandbox ended: its commands that did not finish never will.
END_OPEN_EXECS = text(
    """
    UPDATE sandbox_execs
    SET status = 'finished', error = :error, finished_at = now()
    WHERE run_id = :run_id AND status <> 'finished'
    """
)

# One command as its caller sees it, with its sandbox's status (an ended sandbox ends it).
EXEC_VIEW = text(
    """
    SELECT e.id, e.run_id, e.command, e.cwd, e.timeout_seconds, e.status, e.exit_code,
           e.timed_out, e.error, e.stdout_end, e.stderr_end, e.truncated, e.created_at,
           e.started_at, e.finished_at, r.status AS sandbox_status
    FROM sandbox_execs e
    JOIN sandboxes s ON s.run_id = e.run_id
    JOIN tool_runs r ON r.id = e.run_id
    WHERE e.id = :exec_id AND e.run_id = :run_id
      AND (CAST(:tenant AS text) IS NULL OR s.tenant = :tenant)
    """
)

# A sandbox's newest commands, for its page (``ix_sandbox_execs_run``).
LIST_EXECS = text(
    """
    SELECT e.id, e.run_id, e.command, e.cwd, e.timeout_seconds, e.status, e.exit_code,
           e.timed_out, e.error, e.stdout_end, e.stderr_end, e.truncated, e.created_at,
           e.started_at, e.finished_at, r.status AS sandbox_status
    FROM sandbox_execs e JOIN tool_runs r ON r.id = e.run_id
    WHERE e.run_id = :run_id
    ORDER BY e.created_at DESC, e.id DESC
    LIMIT :limit
    """
)

# Output chunks from the given ends on, in the order they were stored; each stream's chunks
# form one chain, so filtering by offset never skips one that commits late.
CHUNKS_FROM = text(
    """
    SELECT stream, "offset", length, data
    FROM sandbox_exec_chunks
    WHERE exec_id = :exec_id
      AND ((stream = 'stdout' AND "offset" >= :stdout_from)
           OR (stream = 'stderr' AND "offset" >= :stderr_from))
    ORDER BY seq
    LIMIT :limit
    """
)
