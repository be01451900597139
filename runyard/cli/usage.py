"""``runyard usage``: what a tenant's runs consumed, as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import io
from datetime import date
from typing import Any

from runyard.cli.common import EXIT_OK, as_json, client_for, emit
from runyard_client import UsageLine, UsageReport

_COLUMNS = [name for name in UsageLine.model_fields if name != "key"]


def _mib(value: float) -> str:
    return f"{value / (1 << 20):.1f}"


def usage_table(report: UsageReport) -> str:
    """The report as aligned text: one line per key and kind (runs, builds), then the
    total."""
    rows = [
        f"{report.group_by.upper():24}  {'KIND':5}  {'RUNS':>6}  {'ATTEMPTS':>8}  {'CPU S':>10}  "
        f"{'WALL S':>10}  {'PEAK MIB':>9}  {'DISK MIB':>9}  {'NET MIB':>8}"
    ]
    for line in (*report.lines, report.total):
        rows.append(
            f"{line.key[:24]:24}  {line.kind[:5]:5}  {line.runs:>6}  {line.attempts:>8}  "
            f"{line.cpu_seconds:>10.2f}  "
            f"{line.wall_seconds:>10.1f}  {_mib(line.memory_peak_bytes):>9}  "
            f"{_mib(line.disk_bytes):>9}  {_mib(line.net_rx_bytes + line.net_tx_bytes):>8}"
        )
    who = report.tenant or "every tenant"
    return f"usage of {who}, {report.from_} to {report.to} (UTC days)\n" + "\n".join(rows)


def usage_csv(report: UsageReport) -> str:
    """The report's lines as CSV, as ``GET /v1/usage?format=csv`` answers it."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([report.group_by, *_COLUMNS])
    for line in report.lines:
        writer.writerow([line.key, *(getattr(line, name) for name in _COLUMNS)])
    return out.getvalue().rstrip("\n")


def _usage(args: argparse.Namespace) -> int:
    report = client_for(args).get_usage(
        first=args.first, last=args.last, group_by=args.by, tenant=args.tenant
    )
    if args.csv:
        print(usage_csv(report))  # noqa: T201
        return EXIT_OK
    emit(args, as_json(report), usage_table(report))
    return EXIT_OK


def add_usage_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``runyard usage [--from DAY] [--to DAY] [--by tool|day|tenant] [--tenant T] [--csv]``."""
    usage = sub.add_parser(
        "usage",
        parents=[common],
        help="what the runs consumed: CPU, memory, time, disk and network, summed",
        description="Usage of the key's tenant (an admin's: every tenant's, or --tenant's) over "
        "whole UTC days, both ends included; this month by default.",
    )
    usage.add_argument("--from", dest="first", type=date.fromisoformat, help="first day")
    usage.add_argument("--to", dest="last", type=date.fromisoformat, help="last day")
    usage.add_argument("--by", choices=["tool", "day", "tenant"], default="tool")
    usage.add_argument("--tenant", help="an admin's report of one tenant")
    usage.add_argument("--csv", action="store_true", help="CSV instead of a table")
    usage.set_defaults(func=_usage)
