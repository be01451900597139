"""The named SQL statements of ``runyard.usage``, one per operation.

``{NOW}`` stands for the injected clock or, when ``:now`` is NULL, the database's ``now()``.
"""

from __future__ import annotations

from typing import LiteralString

from sqlalchemy import TextClause, text

_NOW = "coalesce(CAST(:now AS timestamptz), now())"


def _sql(statement: LiteralString) -> TextClause:
    return text(statement.replace("{NOW}", _NOW))


# An attempt's usage, fenced like FINALIZE: only the holder of the job's lease writes, and
# the primary key (run, attempt) lets the first write stand, so an adopter that reads the
# same container again after its owner died between this and the finalize adds nothing. The
# tenant's running totals and those of its day grow in the same statement, only when the row
# is new.
RECORD_USAGE = _sql(
    """
    WITH job AS (
        SELECT j.run_id, j.attempts, r.tenant, r.tool
        FROM tool_run_jobs j JOIN tool_runs r ON r.id = j.run_id
        WHERE j.id = :job_id AND j.lease_token = :token AND j.status = 'running'
    ), added AS (
        INSERT INTO attempt_usage (run_id, attempt, tenant, tool, recorded_at, cpu_seconds,
                                   memory_peak_bytes, memory_avg_bytes, wall_seconds,
                                   disk_bytes, net_rx_bytes, net_tx_bytes)
        SELECT run_id, attempts, tenant, tool, {NOW}, :cpu_seconds, :memory_peak_bytes,
               :memory_avg_bytes, :wall_seconds, :disk_bytes, :net_rx_bytes, :net_tx_bytes
        FROM job
        ON CONFLICT (run_id, attempt) DO NOTHING
        RETURNING tenant
    ), totals AS (
        INSERT INTO tenant_usage_totals AS t (tenant, attempts, cpu_seconds, wall_seconds,
                                              memory_byte_seconds, disk_bytes, net_bytes)
        SELECT tenant, 1, :cpu_seconds, :wall_seconds,
               CAST(:memory_avg_bytes AS double precision) * :wall_seconds, :disk_bytes,
               coalesce(:net_rx_bytes, 0) + coalesce(:net_tx_bytes, 0)
        FROM added
        ON CONFLICT (tenant) DO UPDATE
        SET attempts = t.attempts + 1, cpu_seconds = t.cpu_seconds + excluded.cpu_seconds,
            wall_seconds = t.wall_seconds + excluded.wall_seconds,
            memory_byte_seconds = t.memory_byte_seconds + excluded.memory_byte_seconds,
            disk_bytes = t.disk_bytes + excluded.disk_bytes,
            net_bytes = t.net_bytes + excluded.net_bytes
        RETURNING tenant
    ), day AS (
        INSERT INTO tenant_usage_days AS d (tenant, day, attempts, cpu_seconds)
        SELECT tenant, CAST(({NOW}) AT TIME ZONE 'UTC' AS date), 1, :cpu_seconds FROM added
        ON CONFLICT (tenant, day) DO UPDATE
        SET attempts = d.attempts + 1, cpu_seconds = d.cpu_seconds + excluded.cpu_seconds
    )
    SELECT (SELECT count(*) FROM job) AS owned, (SELECT count(*) FROM totals) AS recorded
    """
)


# An image build's usage, fenced by the build's lease as BUILD_READY and BUILD_FAILED are
# (written right before them), once per build and round (the primary key: the build row and
# the round's first claim, which a rebuild clears). Charged to the tenant of the oldest run
# waiting for the image; none waiting (an admin's rebuild): a platform-level row (NULL).
# Wall time runs from the round's first claim, so a build taken over after its worker died
# counts the dead one's time too, as its parent cgroup counts its CPU.
RECORD_BUILD_USAGE = _sql(
    """
    WITH build AS (
        SELECT id, tag, tool, engine_id, coalesce(first_started_at, started_at) AS started_at
        FROM tool_builds
        WHERE id = :build_id AND lease_token = :token AND status = 'building'
    ), asker AS (
        SELECT j.tenant FROM tool_run_jobs j, build b
        WHERE j.status = 'queued' AND j.build_tag <> '' AND j.build_tag = b.tag
        ORDER BY j.created_at, j.id
        LIMIT 1
    ), added AS (
        INSERT INTO build_usage (build_id, started_at, tag, tool, engine_id, tenant,
                                 recorded_at, wall_seconds, cpu_seconds, memory_peak_bytes)
        SELECT id, started_at, tag, tool, engine_id, (SELECT tenant FROM asker), {NOW},
               greatest(extract(epoch FROM {NOW} - started_at), 0), :cpu_seconds,
               :memory_peak_bytes
        FROM build
        ON CONFLICT (build_id, started_at) DO NOTHING
        RETURNING build_id
    )
    SELECT (SELECT count(*) FROM build) AS owned, (SELECT count(*) FROM added) AS recorded
    """
)


# A report: the records of a window (a tenant's, or every tenant's when :tenant is NULL)
# summed by kind (a run's attempts, or image builds) and tool, UTC day or tenant. A build
# counts as an attempt of no run; what it could not measure counts as nothing; a
# platform-level build (no tenant) is in an admin's report of every tenant only.
USAGE_REPORT = _sql(
    """
    WITH records AS (
        SELECT 'run' AS kind, tenant, tool, recorded_at, run_id, cpu_seconds, wall_seconds,
               memory_peak_bytes,
               CAST(memory_avg_bytes AS double precision) * wall_seconds AS memory_byte_seconds,
               disk_bytes, net_rx_bytes, net_tx_bytes
        FROM attempt_usage
        WHERE recorded_at >= :start AND recorded_at < :end
          AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
        UNION ALL
        SELECT 'build', coalesce(tenant, '(platform)'), tool, recorded_at, NULL,
               coalesce(cpu_seconds, 0), wall_seconds, coalesce(memory_peak_bytes, 0), 0, 0,
               NULL, NULL
        FROM build_usage
        WHERE recorded_at >= :start AND recorded_at < :end
          AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
    )
    SELECT kind,
           CASE CAST(:group_by AS text)
               WHEN 'tool' THEN tool
               WHEN 'tenant' THEN tenant
               ELSE to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') END AS key,
           count(DISTINCT run_id) AS runs, count(*) AS attempts,
           sum(cpu_seconds) AS cpu_seconds, sum(wall_seconds) AS wall_seconds,
           max(memory_peak_bytes) AS memory_peak_bytes,
           sum(memory_byte_seconds) AS memory_byte_seconds,
           sum(disk_bytes) AS disk_bytes, sum(net_rx_bytes) AS net_rx_bytes,
           sum(net_tx_bytes) AS net_tx_bytes
    FROM records
    GROUP BY 2, 1
    ORDER BY 2, 1 DESC
    """
)


# What one run's attempts used, summed (its final webhook carries it); no row: none metered.
RUN_USAGE = _sql(
    """
    SELECT count(*) AS attempts, sum(cpu_seconds) AS cpu_seconds,
           sum(wall_seconds) AS wall_seconds, max(memory_peak_bytes) AS memory_peak_bytes,
           sum(disk_bytes) AS disk_bytes, sum(net_rx_bytes) AS net_rx_bytes,
           sum(net_tx_bytes) AS net_tx_bytes
    FROM attempt_usage WHERE run_id = :run_id
    HAVING count(*) > 0
    """
)


# The CPU seconds a tenant's attempts used on the UTC day of {NOW}: the daily quota's read.
CPU_SPENT_TODAY = _sql(
    """
    SELECT coalesce(sum(cpu_seconds), 0) AS cpu_seconds FROM tenant_usage_days
    WHERE tenant = :tenant AND day = CAST(({NOW}) AT TIME ZONE 'UTC' AS date)
    """
)


# Every tenant's running totals, for the per-tenant counters.
TENANT_TOTALS = _sql(
    """
    SELECT tenant, attempts, cpu_seconds, wall_seconds, memory_byte_seconds, disk_bytes,
           net_bytes
    FROM tenant_usage_totals ORDER BY tenant
    """
)
