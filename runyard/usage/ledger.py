"""The usage ledger: an attempt's usage written once under its lease, reports and the quota."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine

from runyard.domain.usage import AttemptUsage, BuildUsage, GroupBy, Window
from runyard.platform.db import autocommit
from runyard.usage.sql import (
    CPU_SPENT_TODAY,
    RECORD_BUILD_USAGE,
    RECORD_USAGE,
    RUN_USAGE,
    TENANT_TOTALS,
    USAGE_REPORT,
)


class Recorded(StrEnum):
    """What became of an attempt's usage handed to the ledger."""

    RECORDED = "recorded"
    # The attempt's usage was recorded before (by an owner that died before its finalize).
    ALREADY = "already"
    # The lease is no longer ours: nothing was written.
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True)
class UsageLine:
    """One line of a report: the records of one tool, day or tenant summed."""

    key: str
    runs: int
    attempts: int
    cpu_seconds: float
    wall_seconds: float
    memory_peak_bytes: int
    memory_byte_seconds: float
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    # ``run``: attempts of runs; ``build``: image builds (each counted as an attempt of no
    # run); ``all``: a report's total of both.
    kind: str = "run"


@dataclass(frozen=True)
class TenantTotals:
    """A tenant's usage summed since it began."""

    tenant: str
    attempts: int
    cpu_seconds: float
    wall_seconds: float
    memory_byte_seconds: float
    disk_bytes: int
    net_bytes: int


def usage_params(usage: AttemptUsage) -> dict[str, Any]:
    """The bind parameters of ``RECORD_USAGE`` for ``usage``."""
    return {
        "cpu_seconds": usage.cpu_seconds,
        "memory_peak_bytes": usage.memory_peak_bytes,
        "memory_avg_bytes": usage.memory_avg_bytes,
        "wall_seconds": usage.wall_seconds,
        "disk_bytes": usage.disk_bytes,
        "net_rx_bytes": usage.net_rx_bytes,
        "net_tx_bytes": usage.net_tx_bytes,
    }


class UsageLedger:
    """Reads and writes ``attempt_usage``, ``build_usage`` and ``tenant_usage_totals``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def record(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        usage: AttemptUsage,
        *,
        now: datetime | None = None,
    ) -> Recorded:
        """Record the usage of the job's current attempt under its lease (once per attempt)."""
        params = {"job_id": job_id, "token": token, "now": now, **usage_params(usage)}
        row = autocommit(self._engine, RECORD_USAGE, params)[0]
        if not row.owned:
            return Recorded.LEASE_LOST
        return Recorded.RECORDED if row.recorded else Recorded.ALREADY

    def record_build(
        self,
        build_id: uuid.UUID,
        token: uuid.UUID,
        usage: BuildUsage,
        *,
        now: datetime | None = None,
    ) -> Recorded:
        """Record an image build's usage under its lease (once per build and round)."""
        params = {
            "build_id": build_id,
            "token": token,
            "now": now,
            "cpu_seconds": usage.cpu_seconds,
            "memory_peak_bytes": usage.memory_peak_bytes,
        }
        row = autocommit(self._engine, RECORD_BUILD_USAGE, params)[0]
        if not row.owned:
            return Recorded.LEASE_LOST
        return Recorded.RECORDED if row.recorded else Recorded.ALREADY

    def report(self, window: Window, group_by: GroupBy, tenant: str | None) -> list[UsageLine]:
        """The window's records summed by ``group_by``: ``tenant``'s, or all (None)."""
        params = {
            "start": window.start,
            "end": window.end,
            "group_by": group_by.value,
            "tenant": tenant,
        }
        return [
            UsageLine(
                key=row.key,
                runs=int(row.runs),
                attempts=int(row.attempts),
                cpu_seconds=float(row.cpu_seconds),
                wall_seconds=float(row.wall_seconds),
                memory_peak_bytes=int(row.memory_peak_bytes),
                memory_byte_seconds=float(row.memory_byte_seconds),
                disk_bytes=int(row.disk_bytes),
                net_rx_bytes=int(row.net_rx_bytes or 0),
                net_tx_bytes=int(row.net_tx_bytes or 0),
                kind=row.kind,
            )
            for row in autocommit(self._engine, USAGE_REPORT, params)
        ]

    def of_run(self, run_id: uuid.UUID) -> dict[str, Any] | None:
        """What the run's metered attempts used, summed, as JSON; None if none was metered."""
        rows = autocommit(self._engine, RUN_USAGE, {"run_id": run_id})
        if not rows:
            return None
        row = rows[0]
        return {
            "attempts": int(row.attempts),
            "cpu_seconds": float(row.cpu_seconds),
            "wall_seconds": float(row.wall_seconds),
            "memory_peak_bytes": int(row.memory_peak_bytes),
            "disk_bytes": int(row.disk_bytes),
            "net_rx_bytes": None if row.net_rx_bytes is None else int(row.net_rx_bytes),
            "net_tx_bytes": None if row.net_tx_bytes is None else int(row.net_tx_bytes),
        }

    def cpu_seconds_today(self, tenant: str, *, now: datetime | None = None) -> float:
        """The CPU seconds the tenant's attempts used on this UTC day (the database's)."""
        rows = autocommit(self._engine, CPU_SPENT_TODAY, {"tenant": tenant, "now": now})
        return float(rows[0].cpu_seconds)

    def totals(self) -> list[TenantTotals]:
        """Every tenant's running totals."""
        return [
            TenantTotals(
                tenant=row.tenant,
                attempts=int(row.attempts),
                cpu_seconds=float(row.cpu_seconds),
                wall_seconds=float(row.wall_seconds),
                memory_byte_seconds=float(row.memory_byte_seconds),
                disk_bytes=int(row.disk_bytes),
                net_bytes=int(row.net_bytes),
            )
            for row in autocommit(self._engine, TENANT_TOTALS, {})
        ]
