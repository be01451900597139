"""Response models of usage reports (``GET /v1/usage``)."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, Field

from runyard.domain.usage import GroupBy


class UsageLineOut(BaseModel):
    """One tool's, day's or tenant's usage summed over the report's window."""

    key: str = Field(description="The tool, the UTC day (YYYY-MM-DD) or the tenant")
    runs: int
    attempts: int = Field(description="Attempts metered (a retried run counts each attempt)")
    cpu_seconds: float
    wall_seconds: float = Field(description="The attempts' containers' time from start to exit")
    memory_peak_bytes: int = Field(description="The highest peak of any one attempt")
    memory_byte_seconds: float = Field(description="Average memory times wall time, summed")
    disk_bytes: int = Field(description="Bytes the attempts left under /runyard, summed")
    net_rx_bytes: int = Field(description="Received over the network (networked tools only)")
    net_tx_bytes: int = Field(description="Sent over the network (networked tools only)")
    kind: Literal["run", "build", "all"] = Field(
        "run",
        description="run: attempts of runs; build: image builds (each an attempt of no run, "
        "CPU and peak of its steps where the engine lets them be read); all: the total",
    )


class UsageReportOut(BaseModel):
    """Usage over whole UTC days, both ends included."""

    from_: date = Field(alias="from", serialization_alias="from")
    to: date
    group_by: GroupBy
    tenant: str | None = Field(description="The tenant reported on; null: every tenant")
    lines: list[UsageLineOut]
    total: UsageLineOut
