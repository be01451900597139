"""Request and response models of batches; requests forbid unknown fields."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import pydantic
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from api.schemas import RunLimits
from runyard.domain.flow_limits import CONCURRENCY_KEY_PATTERN
from runyard.domain.graph import MAX_BATCH_RUNS, MAX_DEPENDENCIES
from runyard.registry.tools import TOOL_NAME_PATTERN
from runyard.submission.batches import BatchItem, BatchRun, BatchView, ListedBatch
from runyard.submission.request import RunRequest
from runyard.webhooks.urls import MAX_URL_LENGTH

REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# A ref of the batch (its default refs start with '#') or a run id.
Dependency = Annotated[str, Field(min_length=1, max_length=64)]


class BatchItemIn(BaseModel):
    """One run of a batch: a ref for the others to name, and what to run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ref: str | None = Field(
        default=None,
        pattern=REF_PATTERN,
        description="The run's name in the batch (default: its position, e.g. '#3')",
    )
    tool: str = Field(min_length=1, max_length=63, pattern=TOOL_NAME_PATTERN)
    input: Any = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-100, le=100)
    limits: RunLimits | None = None
    depends_on: list[Dependency] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="Refs of this batch, or ids of existing runs of yours",
    )
    run_at: AwareDatetime | None = Field(
        default=None, strict=False, description="Not before (RFC 3339), at most 30 days ahead"
    )
    callback_url: str | None = Field(default=None, min_length=1, max_length=MAX_URL_LENGTH)
    concurrency_key: str | None = Field(
        default=None, pattern=CONCURRENCY_KEY_PATTERN, description="The run's flow-control key"
    )

    def item(
        self,
        index: int,
        tenant: str,
        max_priority: int | None,
        callback: str | None,
        allowed_tools: frozenset[str] | None = None,
    ) -> BatchItem:
        """The core's batch item."""
        limits = self.limits.model_dump(exclude_none=True) if self.limits else {}
        request = RunRequest(
            tenant,
            self.tool,
            self.input,
            self.priority,
            callback_url=self.callback_url or callback,
            max_priority=max_priority,
            allowed_tools=allowed_tools,
            limits=limits,
            depends_on=tuple(dict.fromkeys(self.depends_on)),
            run_at=self.run_at,
            concurrency_key=self.concurrency_key,
        )
        return BatchItem(ref=self.ref or f"#{index}", request=request)


class BatchCreate(BaseModel):
    """Runs submitted as one graph: all are admitted or none."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "runs": [
                        {"ref": "build", "tool": "echo", "input": {"step": "build"}},
                        {
                            "ref": "test",
                            "tool": "echo",
                            "input": {"step": "test"},
                            "depends_on": ["build"],
                        },
                    ]
                },
                {
                    "runs": [
                        {"ref": "warm-up", "tool": "sleep", "input": {"seconds": 1}},
                        {
                            "ref": "report",
                            "tool": "echo",
                            "input": {"after": "warm-up"},
                            "depends_on": ["warm-up"],
                        },
                    ]
                },
            ]
        },
    )

    runs: list[BatchItemIn] = Field(min_length=1, max_length=MAX_BATCH_RUNS)
    callback_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="Each run's callback_url unless the run names its own",
    )

    def items(
        self, tenant: str, max_priority: int | None, allowed_tools: frozenset[str] | None = None
    ) -> list[BatchItem]:
        """The core's items, in the order given."""
        return [
            run.item(index, tenant, max_priority, self.callback_url, allowed_tools)
            for index, run in enumerate(self.runs)
        ]


@pydantic.dataclasses.dataclass(frozen=True)
class BatchRunOut(BatchRun):
    """A run of a batch: the latest run of its ref (a retry's run replaces the one it re-runs)."""


class BatchOut(BaseModel):
    """A batch: status, counts of its runs by status, and its runs by ref."""

    id: uuid.UUID
    status: str = Field(description="queued, running, succeeded, failed or cancelled")
    created_at: datetime
    size: int = Field(description="Runs submitted with it")
    counts: dict[str, int]
    runs: list[BatchRunOut]

    @classmethod
    def of(cls, view: BatchView) -> BatchOut:
        """From the read model."""
        return cls(
            id=view.id,
            status=view.status,
            created_at=view.created_at,
            size=view.size,
            counts=view.counts,
            runs=[BatchRunOut(**vars(run)) for run in view.runs],
        )


class BatchCreated(BatchOut):
    """The batch as accepted, with the run id of every ref."""

    run_ids: dict[str, uuid.UUID] = Field(description="ref → run id")


class BatchListed(BaseModel):
    """A batch in a list: its status and counts; its runs are on its own page."""

    id: uuid.UUID
    status: str = Field(description="queued, running, succeeded, failed or cancelled")
    created_at: datetime
    size: int = Field(description="Runs submitted with it")
    counts: dict[str, int] = Field(description="Its runs (the latest of each ref) by status")

    @classmethod
    def of(cls, listed: ListedBatch) -> BatchListed:
        """From the read model."""
        return cls(**vars(listed))


class BatchPage(BaseModel):
    """Batches newest first, with the cursor of the next page."""

    items: list[BatchListed]
    next_cursor: str | None
