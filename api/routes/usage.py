"""Metered usage: what a tenant's runs consumed, as JSON or CSV."""

from __future__ import annotations

from dataclasses import asdict
from datetime import date
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import PlainTextResponse

from api.actions.usage import report_csv, usage_report
from api.deps import PrincipalDep, ServicesDep
from api.openapi import COMMON_ERRORS, problem
from api.usage_schemas import UsageLineOut, UsageReportOut
from runyard.domain.usage import GroupBy

router = APIRouter(prefix="/v1/usage", tags=["usage"], responses=COMMON_ERRORS)

CSV = "text/csv"
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {CSV: {"schema": {"type": "string"}}}},
    400: problem("'to' before 'from', or a window longer than the longest report"),
    404: problem("Another tenant's usage (only an admin may name a tenant)"),
}


@router.get("", operation_id="getUsage", responses=RESPONSES, response_model=UsageReportOut)
def get_usage(
    services: ServicesDep,
    principal: PrincipalDep,
    first: Annotated[date | None, Query(alias="from", description="First UTC day")] = None,
    last: Annotated[date | None, Query(alias="to", description="Last UTC day, included")] = None,
    group_by: GroupBy = GroupBy.TOOL,
    tenant: Annotated[str | None, Query(max_length=200, description="Admins only")] = None,
    format: Literal["json", "csv"] | None = None,
    accept: Annotated[str, Header()] = "",
) -> Any:
    """Usage summed by tool, day or tenant over whole UTC days (this month by default):
    a tenant's own; an admin's of every tenant, or of the one named. ``?format=csv`` or
    ``Accept: text/csv`` answers CSV."""
    report = usage_report(
        services, principal, first=first, last=last, group_by=group_by, tenant=tenant
    )
    if format == "csv" or (format is None and CSV in accept.lower()):
        return PlainTextResponse(report_csv(report), media_type=CSV)
    return UsageReportOut(
        **{"from": report.first},
        to=report.last,
        group_by=report.group_by,
        tenant=report.tenant,
        lines=[UsageLineOut(**asdict(line)) for line in report.lines],
        total=UsageLineOut(**asdict(report.total())),
    )
