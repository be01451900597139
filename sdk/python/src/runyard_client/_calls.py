"""Every request either client sends, built once, with how its answer is read: the sync and
the async client only send a ``Call`` and hand the answer to ``Call.parse``."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

import httpx2
from pydantic import TypeAdapter

from runyard_client._retry import is_safe
from runyard_client.models import (
    Artifact,
    ArtifactList,
    Batch,
    BatchItem,
    BatchPage,
    BatchSummary,
    Build,
    BuildRequested,
    Limits,
    Run,
    RunPage,
    RunStatus,
    Schedule,
    SchedulePage,
    TenantWebhook,
    Tool,
    UsageReport,
)

T = TypeVar("T")
Id = str | uuid.UUID
JsonInput = Any

# Each long-poll asks the API to hold the answer this long (it caps it at its own
# RUNYARD_MAX_WAIT_SECONDS); short enough for proxies that cut idle connections.
WAIT_SLICE_SECONDS = 30.0
# Where ``runyard api`` and ``runyard dev`` listen unless told otherwise.
DEFAULT_URL = "http://127.0.0.1:8000"

_TOOLS = TypeAdapter(builtins.list[Tool])
_BUILDS = TypeAdapter(builtins.list[Build])


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its (successful, fully read) answer."""

    method: str
    path: str
    parse: Callable[[httpx2.Response], T]
    params: Mapping[str, str | int | float] = field(default_factory=dict)
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # Raw bytes to send instead of JSON (a file into a sandbox).
    content: bytes | None = None
    # A submit may be answered only when the run ends (sync mode, ``?wait``): no read bound.
    unbounded_read: bool = False
    # A long-poll (``?wait=S``): the API may hold the answer this long before its first byte.
    held_seconds: float = 0.0

    @property
    def safe(self) -> bool:
        """Whether the request may be sent again after a transient failure."""
        return is_safe(self.method, self.headers)


def segment(value: Id) -> str:
    """A run or batch id as one path segment."""
    return quote(str(value), safe="")


def _run(response: httpx2.Response) -> Run:
    return Run.model_validate_json(response.content)


def _batch(response: httpx2.Response) -> Batch:
    return Batch.model_validate_json(response.content)


def _run_page(response: httpx2.Response) -> RunPage:
    return RunPage.model_validate_json(response.content)


def _batch_page(response: httpx2.Response) -> BatchPage:
    return BatchPage.model_validate_json(response.content)


def _nothing(response: httpx2.Response) -> None:
    return None


def new_idempotency_key() -> str:
    """A fresh key: a retried request with it never makes a second run."""
    return str(uuid.uuid4())


def submit_body(
    tool: str,
    input: JsonInput,
    *,
    depends_on: Iterable[Id] = (),
    run_at: datetime | None = None,
    callback_url: str | None = None,
    priority: int | None = None,
    limits: Limits | Mapping[str, Any] | None = None,
    concurrency_key: str | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/runs``: only the fields given (the API's defaults apply)."""
    body: dict[str, Any] = {"tool": tool, "input": input}
    if priority is not None:
        body["priority"] = priority
    if limits is not None:
        given = limits if isinstance(limits, Limits) else Limits.model_validate(limits)
        body["limits"] = given.model_dump(exclude_none=True)
    if callback_url is not None:
        body["callback_url"] = callback_url
    dependencies = [str(dep) for dep in depends_on]
    if dependencies:
        body["depends_on"] = dependencies
    if run_at is not None:
        body["run_at"] = run_at.isoformat()
    if concurrency_key is not None:
        body["concurrency_key"] = concurrency_key
    return body


def waited(wait: float) -> dict[str, str | int | float]:
    """The query of a long-poll of ``wait`` seconds (none for 0)."""
    return {"wait": round(wait, 3)} if wait > 0 else {}


def submit(body: dict[str, Any], idempotency_key: str | None, wait: float = 0) -> Call[Run]:
    """Submit a run; with ``wait`` the API holds the answer until the run ends or that many
    seconds pass (it answers the run as it is then)."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call(
        "POST",
        "/v1/runs",
        _run,
        params=waited(wait),
        json=body,
        headers=headers,
        unbounded_read=True,
    )


def get_run(run_id: Id, wait: float = 0) -> Call[Run]:
    """One run; with ``wait`` the API holds the answer until the run ends or that many
    seconds pass (it answers the run as it is then)."""
    return Call("GET", f"/v1/runs/{segment(run_id)}", _run, params=waited(wait), held_seconds=wait)


def cancel(run_id: Id) -> Call[Run]:
    """Cancel a queued run, or ask whoever runs it to stop."""
    return Call("POST", f"/v1/runs/{segment(run_id)}/cancel", _run)


def rerun(run_id: Id) -> Call[Run]:
    """A new run of the same tool and input."""
    return Call("POST", f"/v1/runs/{segment(run_id)}/rerun", _run)


def delete(run_id: Id) -> Call[None]:
    """Delete a terminal run with everything that belongs to it."""
    return Call("DELETE", f"/v1/runs/{segment(run_id)}", _nothing)


def logs(run_id: Id, stream: str) -> Call[str]:
    """The run's output so far (live chunks while it runs, the stored streams once ended)."""
    return Call(
        "GET", f"/v1/runs/{segment(run_id)}/logs", lambda r: r.text, params={"stream": stream}
    )


def artifacts(run_id: Id) -> Call[builtins.list[Artifact]]:
    """A terminal run's artifact list."""
    return Call(
        "GET",
        f"/v1/runs/{segment(run_id)}/artifacts",
        lambda r: builtins.list(ArtifactList.model_validate_json(r.content).artifacts),
    )


def tools() -> Call[builtins.list[Tool]]:
    """The registered tools."""
    return Call("GET", "/v1/tools", lambda r: _TOOLS.validate_json(r.content))


def submit_batch(
    runs: Sequence[BatchItem | Mapping[str, Any]],
    callback_url: str | None,
    idempotency_key: str | None,
) -> Call[Batch]:
    """Submit runs as one graph: every one is admitted or none."""
    items = [run if isinstance(run, BatchItem) else BatchItem.model_validate(run) for run in runs]
    body: dict[str, Any] = {
        "runs": [item.model_dump(mode="json", exclude_defaults=True) for item in items]
    }
    for item, dumped in zip(items, body["runs"], strict=True):
        dumped["tool"], dumped["input"] = item.tool, item.input  # always sent
    if callback_url is not None:
        body["callback_url"] = callback_url
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/batches", _batch, json=body, headers=headers)


def get_batch(batch_id: Id, wait: float = 0) -> Call[Batch]:
    """One batch with its runs; with ``wait`` the API holds the answer until no run of it is
    queued or running, or that many seconds pass (it answers the batch as it is then)."""
    return Call(
        "GET",
        f"/v1/batches/{segment(batch_id)}",
        _batch,
        params=waited(wait),
        held_seconds=wait,
    )


def cancel_batch(batch_id: Id) -> Call[Batch]:
    """Cancel a batch's queued runs and ask its running ones to stop."""
    return Call("POST", f"/v1/batches/{segment(batch_id)}/cancel", _batch)


def retry_batch(batch_id: Id) -> Call[Batch]:
    """New runs for every ref of the batch that did not succeed."""
    return Call("POST", f"/v1/batches/{segment(batch_id)}/retry", _batch)


def _schedule(response: httpx2.Response) -> Schedule:
    return Schedule.model_validate_json(response.content)


def create_schedule(
    tool: str,
    input: JsonInput,
    *,
    cron: str | None,
    every_seconds: int | None,
    timezone: str | None,
    start_at: datetime | None,
    end_at: datetime | None,
    catch_up: str | None,
    priority: int | None,
) -> Call[Schedule]:
    """A recurring schedule of ``tool`` (a cron expression or a period in seconds)."""
    body: dict[str, Any] = {"tool": tool, "input": input}
    optional = {
        "cron": cron,
        "every_seconds": every_seconds,
        "timezone": timezone,
        "start_at": None if start_at is None else start_at.isoformat(),
        "end_at": None if end_at is None else end_at.isoformat(),
        "catch_up": catch_up,
        "priority": priority,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    return Call("POST", "/v1/schedules", _schedule, json=body)


def schedule_call(schedule_id: Id, action: str | None = None) -> Call[Schedule]:
    """Read a schedule (``action`` None), or ``pause`` or ``resume`` it."""
    path = f"/v1/schedules/{segment(schedule_id)}"
    if action is None:
        return Call("GET", path, _schedule)
    return Call("POST", f"{path}/{action}", _schedule)


def delete_schedule(schedule_id: Id) -> Call[None]:
    """Delete a schedule (the runs it made stay)."""
    return Call("DELETE", f"/v1/schedules/{segment(schedule_id)}", _nothing)


T_co = TypeVar("T_co", covariant=True)


class _Page(Protocol[T_co]):
    @property
    def items(self) -> tuple[T_co, ...]: ...

    @property
    def next_cursor(self) -> str | None: ...


P = TypeVar("P", bound=_Page[Any])


class Pager(Generic[P, T]):
    """Walks a keyset-paginated listing page by page, up to ``limit`` items in all."""

    def __init__(
        self,
        path: str,
        parse: Callable[[httpx2.Response], P],
        params: Mapping[str, str | int | float | None],
        page_size: int,
        limit: int | None,
    ) -> None:
        self._path = path
        self._parse = parse
        self._params = {key: value for key, value in params.items() if value is not None}
        self._page_size = page_size
        self._left = limit
        self._cursor: str | None = None
        self._ended = limit is not None and limit <= 0

    def next_call(self) -> Call[P] | None:
        """The request of the next page, or None when every page (or ``limit``) was read."""
        if self._ended:
            return None
        size = self._page_size if self._left is None else min(self._page_size, self._left)
        params = {**self._params, "limit": size}
        if self._cursor is not None:
            params["cursor"] = self._cursor
        return Call("GET", self._path, self._parse, params=params)

    def take(self, page: P) -> builtins.list[T]:
        """The items of ``page`` to hand out; remembers where the next page starts."""
        items: builtins.list[T] = builtins.list(page.items)
        if self._left is not None:
            items = items[: self._left]
            self._left -= len(items)
        self._cursor = page.next_cursor
        self._ended = self._cursor is None or not items or self._left == 0
        return items


def run_pager(
    status: RunStatus | str | None,
    tool: str | None,
    mode: str | None,
    page_size: int,
    limit: int | None,
) -> Pager[RunPage, Run]:
    """Every run the filters match, newest first."""
    params = {"status": None if status is None else str(status), "tool": tool, "mode": mode}
    return Pager("/v1/runs", _run_page, params, page_size, limit)


def batch_pager(page_size: int, limit: int | None) -> Pager[BatchPage, BatchSummary]:
    """Every batch of the caller's tenant, newest first."""
    return Pager("/v1/batches", _batch_page, {}, page_size, limit)


def schedule_pager(page_size: int, limit: int | None) -> Pager[SchedulePage, Schedule]:
    """Every schedule of the caller's tenant, newest first."""
    return Pager(
        "/v1/schedules",
        lambda r: SchedulePage.model_validate_json(r.content),
        {},
        page_size,
        limit,
    )


def list_page(
    status: RunStatus | str | None,
    tool: str | None,
    mode: str | None,
    limit: int,
    cursor: str | None,
) -> Call[RunPage]:
    """One page of the runs the filters match, newest first."""
    given = {"status": None if status is None else str(status), "tool": tool, "mode": mode}
    params: dict[str, str | int | float] = {k: v for k, v in given.items() if v is not None}
    params["limit"] = limit
    if cursor is not None:
        params["cursor"] = cursor
    return Call("GET", "/v1/runs", _run_page, params=params)


def artifact_list(run_id: Id) -> Call[ArtifactList]:
    """A terminal run's whole artifact listing: counts, the tar's URL, the artifacts."""
    return Call(
        "GET",
        f"/v1/runs/{segment(run_id)}/artifacts",
        lambda r: ArtifactList.model_validate_json(r.content),
    )


def build_tool(tool: str, force: bool) -> Call[BuildRequested]:
    """Queue the build of a tool's current source (admin)."""
    params: dict[str, str | int | float] = {"force": "true"} if force else {}
    return Call(
        "POST",
        f"/v1/tools/{segment(tool)}/build",
        lambda r: BuildRequested.model_validate_json(r.content),
        params=params,
    )


def list_builds(tool: str | None, status: str | None, limit: int) -> Call[builtins.list[Build]]:
    """Builds, newest first, without their logs."""
    given = {"tool": tool, "status": status}
    params: dict[str, str | int | float] = {k: v for k, v in given.items() if v is not None}
    params["limit"] = limit
    return Call("GET", "/v1/builds", lambda r: _BUILDS.validate_json(r.content), params=params)


def get_build(build_id: Id) -> Call[Build]:
    """One build with its log's tail."""
    return Call(
        "GET", f"/v1/builds/{segment(build_id)}", lambda r: Build.model_validate_json(r.content)
    )


def _tenant_webhook(response: httpx2.Response) -> TenantWebhook:
    return TenantWebhook.model_validate_json(response.content)


def get_tenant_webhook(tenant: str) -> Call[TenantWebhook]:
    """A tenant's default webhook (admin)."""
    return Call("GET", f"/v1/tenants/{segment(tenant)}/webhook", _tenant_webhook)


def set_tenant_webhook(
    tenant: str,
    url: str | None,
    rotate_secret: bool,
    events: Sequence[str] | None = None,
    deadline_lead_seconds: int | None = None,
) -> Call[TenantWebhook]:
    """Set a tenant's default webhook URL and events (admin); a new secret comes back once."""
    body: dict[str, Any] = {"url": url, "rotate_secret": rotate_secret}
    if events is not None:
        body["events"] = list(events)
    if deadline_lead_seconds is not None:
        body["deadline_lead_seconds"] = deadline_lead_seconds
    return Call("PUT", f"/v1/tenants/{segment(tenant)}/webhook", _tenant_webhook, json=body)


def get_usage(
    first: date | None, last: date | None, group_by: str, tenant: str | None
) -> Call[UsageReport]:
    """Usage summed by tool, day or tenant over whole UTC days (this month by default)."""
    given = {
        "from": None if first is None else first.isoformat(),
        "to": None if last is None else last.isoformat(),
        "group_by": group_by,
        "tenant": tenant,
    }
    params: dict[str, str | int | float] = {k: v for k, v in given.items() if v is not None}
    return Call(
        "GET", "/v1/usage", lambda r: UsageReport.model_validate_json(r.content), params=params
    )
