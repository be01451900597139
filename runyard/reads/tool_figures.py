"""Per-tool figures for the tools page: runs of a window, the share of finished ones that
failed or timed out, and the median duration, in one statement.

The window is the runs requested in the last ``window`` seconds that have started (a run that
never started is not counted). Every such run also started inside the window, so the
statement bounds both times: a tenant's runs are a range of ``ix_tool_runs_tenant_requested``,
everyone's a range of ``ix_tool_runs_started_at``; either way it reads only the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text

from runyard.platform.db import autocommit

# The tools page's window.
TOOL_WINDOW_SECONDS = 24 * 3600

_FIGURES = """
    SELECT tool, count(*) AS runs,
           count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'timed_out')) AS finished,
           count(*) FILTER (WHERE status IN ('failed', 'timed_out')) AS failed,
           percentile_cont(0.5) WITHIN GROUP (
               ORDER BY extract(epoch FROM finished_at - started_at))
               FILTER (WHERE status IN ('succeeded', 'failed', 'timed_out')) AS p50
    FROM tool_runs
    WHERE requested_at >= now() - make_interval(secs => :window)
      AND started_at >= now() - make_interval(secs => :window) {tenant}
    GROUP BY tool
"""
FIGURES_ALL = text(_FIGURES.format(tenant=""))
FIGURES_OF_TENANT = text(_FIGURES.format(tenant="AND tenant = :tenant"))


@dataclass(frozen=True)
class ToolFigures:
    """One tool's window: runs started, finished (not cancelled) and failed, and the median
    duration of the finished ones."""

    runs: int
    finished: int
    failed: int
    p50_seconds: float | None

    @property
    def failure_rate(self) -> float | None:
        """Failed or timed out over finished (cancelled runs count neither way)."""
        return self.failed / self.finished if self.finished else None


def tool_figures(
    engine: Engine, tenant: str | None, window_seconds: int = TOOL_WINDOW_SECONDS
) -> dict[str, ToolFigures]:
    """Figures by tool name for one tenant or (``None``) all of them."""
    statement = FIGURES_ALL if tenant is None else FIGURES_OF_TENANT
    rows = autocommit(engine, statement, {"window": window_seconds, "tenant": tenant})
    return {
        row.tool: ToolFigures(
            runs=int(row.runs),
            finished=int(row.finished),
            failed=int(row.failed),
            p50_seconds=None if row.p50 is None else float(row.p50),
        )
        for row in rows
    }
