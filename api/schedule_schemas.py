"""Request and response models of schedules; requests forbid unknown fields."""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from runyard.domain.schedule_slots import MAX_CRON_LENGTH, MAX_EVERY_SECONDS, CatchUp
from runyard.registry.tools import TOOL_NAME_PATTERN
from runyard.schedules.store import NewSchedule, ScheduleView

SCHEDULE_EXAMPLE: dict[str, Any] = {
    "id": "7d1f0a52-4c1e-4a57-9d0e-2f1c8f3b9a10",
    "tool": "echo",
    "input": {"message": "good morning"},
    "priority": 0,
    "cron": "0 9 * * 1-5",
    "every_seconds": None,
    "timezone": "Europe/Berlin",
    "start_at": "2026-12-01T00:00:00Z",
    "end_at": None,
    "catch_up": "one",
    "paused": False,
    "next_slot_at": "2026-12-02T08:00:00Z",
    "created_at": "2026-12-01T10:00:00Z",
    "updated_at": "2026-12-01T10:00:00Z",
    "fired": 0,
    "skipped": 0,
    "last_slot_at": None,
    "last_run_id": None,
    "last_error": None,
}


class ScheduleCreate(BaseModel):
    """A recurring schedule: run ``tool`` with ``input`` at each slot of a cron expression or
    a fixed period; unknown fields are refused."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "tool": "echo",
                    "input": {"message": "good morning"},
                    "cron": "0 9 * * 1-5",
                    "timezone": "Europe/Berlin",
                    "catch_up": "one",
                },
                {"tool": "echo", "input": {"message": "tick"}, "every_seconds": 60},
            ]
        },
    )

    tool: str = Field(
        min_length=1, max_length=63, pattern=TOOL_NAME_PATTERN, description="A registered tool"
    )
    input: Any = Field(
        default_factory=dict, description="JSON input of every run, checked like a submit's"
    )
    priority: int = Field(default=0, ge=-100, le=100, description="Each run's priority")
    cron: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CRON_LENGTH,
        description="Five-field cron expression (minute hour day month weekday), read in "
        "timezone; give this or every_seconds",
    )
    every_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_EVERY_SECONDS,
        description="A slot every this many seconds from start_at; give this or cron",
    )
    timezone: str = Field(
        default="UTC", min_length=1, max_length=64, description="IANA time zone of cron"
    )
    start_at: AwareDatetime | None = Field(
        default=None,
        strict=False,
        description="RFC 3339 time of the first slot of every_seconds (default: now); no "
        "slot before the schedule's creation fires",
    )
    end_at: AwareDatetime | None = Field(
        default=None, strict=False, description="RFC 3339 time after which no slot fires"
    )
    catch_up: CatchUp = Field(
        default=CatchUp.NONE,
        strict=False,
        description="Slots missed while no scheduler ran: none (skip them), one (run the "
        "latest), all (run each)",
    )

    def schedule(
        self,
        tenant: str,
        max_priority: int | None,
        allowed_tools: frozenset[str] | None = None,
    ) -> NewSchedule:
        """The core's request for ``tenant``, whose key allows at most ``max_priority`` and
        the tools ``allowed_tools`` (None: every tool)."""
        return NewSchedule(
            tenant=tenant,
            tool=self.tool,
            input=self.input,
            cron=self.cron,
            every_seconds=self.every_seconds,
            timezone=self.timezone,
            start_at=self.start_at,
            end_at=self.end_at,
            catch_up=self.catch_up,
            priority=self.priority,
            max_priority=max_priority,
            allowed_tools=allowed_tools,
        )


@pydantic.dataclasses.dataclass(
    frozen=True, config=ConfigDict(json_schema_extra={"examples": [SCHEDULE_EXAMPLE]})
)
class ScheduleOut(ScheduleView):
    """A schedule as the API shows it (``runyard.schedules.store.ScheduleView``)."""


class SchedulePage(BaseModel):
    """One page of schedules, newest first, with the cursor of the next page."""

    items: list[ScheduleOut]
    next_cursor: str | None
