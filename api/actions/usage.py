"""Usage reports: what a tenant's attempts consumed over whole UTC days (every tenant's for
an admin), summed by tool, day or tenant; as JSON lines or CSV."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, fields
from datetime import UTC, date, datetime

from api.deps import Services, visible_tenant
from api.problems import Problem
from runyard.domain.usage import GroupBy, Window, WindowError, report_window
from runyard.tenancy.auth import Principal
from runyard.usage.ledger import UsageLedger, UsageLine

# Cells a spreadsheet would run as a formula are written as text.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class UsageReport:
    """A report as the API and the dashboard show it."""

    first: date
    last: date
    group_by: GroupBy
    tenant: str | None
    lines: list[UsageLine]

    def total(self) -> UsageLine:
        """Every line summed (the peak is the highest)."""
        lines = self.lines
        return UsageLine(
            key="total",
            runs=sum(line.runs for line in lines),
            attempts=sum(line.attempts for line in lines),
            cpu_seconds=sum(line.cpu_seconds for line in lines),
            wall_seconds=sum(line.wall_seconds for line in lines),
            memory_peak_bytes=max((line.memory_peak_bytes for line in lines), default=0),
            memory_byte_seconds=sum(line.memory_byte_seconds for line in lines),
            disk_bytes=sum(line.disk_bytes for line in lines),
            net_rx_bytes=sum(line.net_rx_bytes for line in lines),
            net_tx_bytes=sum(line.net_tx_bytes for line in lines),
            kind="all",
        )


def usage_report(
    services: Services,
    principal: Principal,
    *,
    first: date | None,
    last: date | None,
    group_by: GroupBy,
    tenant: str | None = None,
) -> UsageReport:
    """The caller's report: a tenant sees its own usage only (another tenant named is not
    found), an admin every tenant's or the one it names."""
    own = visible_tenant(principal)
    if own is not None and tenant is not None and tenant != own:
        raise Problem(404, "tenant_not_found", f"no usage of tenant {tenant!r} to show")
    try:
        window = report_window(first, last, today=datetime.now(UTC).date())
    except WindowError as exc:
        raise Problem(400, "invalid_window", str(exc)) from exc
    who = own if own is not None else tenant
    lines = UsageLedger(services.engine).report(window, group_by, who)
    return UsageReport(_first(window), _last(window), group_by, who, lines)


def _first(window: Window) -> date:
    return window.start.date()


def _last(window: Window) -> date:
    return date.fromordinal(window.end.date().toordinal() - 1)


def _cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def report_csv(report: UsageReport) -> str:
    """The report's lines as CSV, a header first (the key column named by the grouping)."""
    names = [f.name for f in fields(UsageLine)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([report.group_by.value, *names[1:]])
    for line in report.lines:
        writer.writerow([_cell(value) for value in asdict(line).values()])
    return out.getvalue()
