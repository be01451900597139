"""``Runyard``: the blocking client. Requests, parsing, errors and retry decisions live in the
shared modules (``_calls``, ``_flow``, ``_files``); this class sends and sleeps."""

from __future__ import annotations

import builtins
import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import httpx2

from runyard_client import _calls as calls
from runyard_client import _sandboxes as sandbox_calls
from runyard_client._calls import DEFAULT_URL, WAIT_SLICE_SECONDS, Call, Id, Pager
from runyard_client._config import ClientConfig, error_of, stream_error, transport_error
from runyard_client._files import (
    CHUNK_BYTES,
    VerifiedFile,
    destination,
    make_parents,
    pick,
    plan,
)
from runyard_client._flow import (
    MAX_EVENT_BYTES,
    Attempts,
    Deadline,
    EventFollow,
    EventLog,
    LineSplitter,
    LongPoll,
    finished,
    log_lines,
    waiting_batch,
    waiting_run,
)
from runyard_client._retry import RetryPolicy
from runyard_client._sandboxes import Sandbox, SandboxInfo
from runyard_client.errors import RunyardError
from runyard_client.events import Event, SkippedEvent
from runyard_client.models import (
    Artifact,
    ArtifactList,
    Batch,
    BatchItem,
    BatchSummary,
    Build,
    BuildRequested,
    Limits,
    Run,
    RunPage,
    RunStatus,
    Schedule,
    TenantWebhook,
    Tool,
    UsageReport,
)

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741


class Runyard:
    """The runyard API, blocking. Use it as a context manager, or ``close()`` it."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        self._config = ClientConfig(url, api_key, timeout, RetryPolicy(max_retries=max_retries))
        self._http = httpx2.Client(
            base_url=self._config.base_url,
            headers=self._config.headers(),
            timeout=self._config.read_timeout(timeout),
            transport=transport,
        )

    @classmethod
    def from_env(
        cls,
        *,
        url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        transport: httpx2.BaseTransport | None = None,
    ) -> Self:
        """A client of ``RUNYARD_URL`` (default ``http://127.0.0.1:8000``) with the key in
        ``RUNYARD_API_KEY``; a ``url`` or ``api_key`` given (a command line's flags) wins."""
        config = ClientConfig.from_env(url=url, api_key=api_key)
        return cls(
            config.url,
            config.api_key,
            timeout=timeout,
            max_retries=max_retries,
            transport=transport,
        )

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- runs ------------------------------------------------------------------------------

    def submit(
        self,
        tool: str,
        input: Any,
        *,
        idempotency_key: str | None = None,
        depends_on: Sequence[Id] = (),
        run_at: datetime | None = None,
        callback_url: str | None = None,
        priority: int | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
    ) -> Run:
        """Submit a run of ``tool``; the run as accepted (usually ``queued``). With an
        ``idempotency_key`` a retry returns the first run and transient failures are retried."""
        body = calls.submit_body(
            tool,
            input,
            depends_on=depends_on,
            run_at=run_at,
            callback_url=callback_url,
            priority=priority,
            limits=limits,
            concurrency_key=concurrency_key,
        )
        return self._send(calls.submit(body, idempotency_key))

    def run(
        self,
        tool: str,
        input: Any,
        *,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        depends_on: Sequence[Id] = (),
        run_at: datetime | None = None,
        callback_url: str | None = None,
        priority: int | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
    ) -> Run:
        """Submit and wait for the end: the finished run (``WaitTimeoutError`` after
        ``timeout`` s). Long-polls with an idempotency key (a fresh one unless given), so a
        retried request never starts the run twice."""
        body = calls.submit_body(
            tool,
            input,
            depends_on=depends_on,
            run_at=run_at,
            callback_url=callback_url,
            priority=priority,
            limits=limits,
            concurrency_key=concurrency_key,
        )
        key = idempotency_key or calls.new_idempotency_key()
        deadline = Deadline(timeout)
        run = self._send(calls.submit(body, key, deadline.bound(WAIT_SLICE_SECONDS)))
        while not run.done and not deadline.expired():
            run = self._send(calls.submit(body, key, deadline.bound(WAIT_SLICE_SECONDS)))
        return finished(run, run.done, deadline, f"run {run.id}")

    def get(self, run_id: Id) -> Run:
        """One run."""
        return self._send(calls.get_run(run_id))

    def list(
        self,
        *,
        status: RunStatus | str | None = None,
        tool: str | None = None,
        mode: str | None = None,
        page_size: int = 50,
        limit: int | None = None,
    ) -> Iterator[Run]:
        """Every run the filters match, newest first, page after page (up to ``limit``)."""
        return self._walk(calls.run_pager(status, tool, mode, page_size, limit))

    def wait(self, run_id: Id, timeout: float | None = None) -> Run:
        """Wait until the run ends (long-polling ``GET /v1/runs/{id}?wait=`` in slices of at
        most 30 s); the finished run, or ``WaitTimeoutError`` after ``timeout`` seconds."""
        return self._poll(waiting_run(run_id, timeout, self._config.retry))

    def cancel(self, run_id: Id) -> Run:
        """Cancel a queued run at once, or ask whoever runs it to stop."""
        return self._send(calls.cancel(run_id))

    def rerun(self, run_id: Id) -> Run:
        """A new run of the same tool and input (``rerun_of`` names the first)."""
        return self._send(calls.rerun(run_id))

    def delete(self, run_id: Id) -> None:
        """Delete a finished run with its events and artifacts."""
        self._send(calls.delete(run_id))

    def list_page(
        self,
        *,
        status: RunStatus | str | None = None,
        tool: str | None = None,
        mode: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """One page of the runs the filters match, newest first; its ``next_cursor`` (None on
        the last page) is the ``cursor`` of the next."""
        return self._send(calls.list_page(status, tool, mode, limit, cursor))

    # --- events and logs -------------------------------------------------------------------

    def events(
        self,
        run_id: Id,
        after: int | None = None,
        *,
        on_skip: Callable[[SkippedEvent], object] | None = None,
    ) -> Iterator[Event]:
        """The run's events (after the event id ``after``), live until its final status;
        a dropped connection resumes after the last event received. A message whose data is
        not what its type carries is passed over and handed to ``on_skip``."""
        return self._follow(EventFollow(run_id, after, self._config.retry, on_skip=on_skip))

    def events_ndjson(self, run_id: Id, after: int | None = None) -> Iterator[str]:
        """The run's events so far as NDJSON: each line (a JSON object with ``id``,
        ``type``, ``at`` and ``data``) as the API wrote it, to keep or hand to other tools;
        a dropped download resumes after the last line received."""
        log = EventLog(run_id, after, self._config.retry)
        while True:
            try:
                with self._http.stream("GET", log.path, params=log.params()) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise error_of(response)
                    for text in response.iter_text():
                        for line in log.feed(text):
                            yield line
                    for line in log.close():
                        yield line
                return
            except httpx2.TransportError as exc:
                pause = log.failed(transport_error(exc))
            except RunyardError as error:
                pause = log.failed(error)
            time.sleep(pause)

    def logs(
        self,
        run_id: Id,
        follow: bool = False,
        *,
        stream: Literal["stdout", "stderr", "both"] = "both",
    ) -> Iterator[str]:
        """The run's output line by line: what there is now, or with ``follow`` every line
        as it is written until the run ends."""
        if not follow:
            yield from log_lines(self._send(calls.logs(run_id, stream)))
            return
        splitter = LineSplitter(stream)
        with contextlib.closing(
            self._follow(EventFollow(run_id, None, self._config.retry))
        ) as events:
            for event in events:
                yield from splitter.feed(event)
        yield from splitter.close()

    def log_text(self, run_id: Id, *, stream: Literal["stdout", "stderr", "both"] = "both") -> str:
        """The run's output so far as one text, exactly as the API has it (``logs`` gives
        it line by line)."""
        return self._send(calls.logs(run_id, stream))

    # --- artifacts -------------------------------------------------------------------------

    def artifacts(self, run_id: Id) -> builtins.list[Artifact]:
        """The files a finished run left, with their sizes and SHA-256."""
        return self._send(calls.artifacts(run_id))

    def artifact_list(self, run_id: Id) -> ArtifactList:
        """A finished run's whole artifact listing: ``count``, ``total_bytes``, the
        ``tar_url`` of them all in one tar, and the ``artifacts``."""
        return self._send(calls.artifact_list(run_id))

    def download(self, run_id: Id, path: str | Artifact, dest: str | os.PathLike[str]) -> Path:
        """Stream one artifact to ``dest`` (a file, or a directory to put it in), checking
        size and SHA-256; nothing is left at ``dest`` unless they match."""
        artifact = (
            path if isinstance(path, Artifact) else pick(self.artifacts(run_id), run_id, path)
        )
        return self._fetch(artifact, destination(dest, artifact.path))

    def download_all(self, run_id: Id, dest: str | os.PathLike[str]) -> builtins.list[Path]:
        """Stream every artifact into the directory ``dest``, keeping their paths."""
        written = []
        for artifact, target in plan(self.artifacts(run_id), dest):
            make_parents(dest, target)
            written.append(self._fetch(artifact, target))
        return written

    # --- schedules ---------------------------------------------------------------------

    def create_schedule(
        self,
        tool: str,
        input: Any = None,
        *,
        cron: str | None = None,
        every_seconds: int | None = None,
        timezone: str | None = None,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        catch_up: str | None = None,
        priority: int | None = None,
    ) -> Schedule:
        """A recurring schedule: ``tool`` with ``input`` at each slot of ``cron`` (in
        ``timezone``) or every ``every_seconds``; each slot makes one run."""
        call = calls.create_schedule(
            tool,
            {} if input is None else input,
            cron=cron,
            every_seconds=every_seconds,
            timezone=timezone,
            start_at=start_at,
            end_at=end_at,
            catch_up=catch_up,
            priority=priority,
        )
        return self._send(call)

    def get_schedule(self, schedule_id: Id) -> Schedule:
        """One of your schedules."""
        return self._send(calls.schedule_call(schedule_id))

    def list_schedules(
        self, *, page_size: int = 50, limit: int | None = None
    ) -> Iterator[Schedule]:
        """Every schedule of yours, newest first, page after page (up to ``limit``)."""
        return self._walk(calls.schedule_pager(page_size, limit))

    def pause_schedule(self, schedule_id: Id) -> Schedule:
        """Stop firing the schedule's slots until resumed."""
        return self._send(calls.schedule_call(schedule_id, "pause"))

    def resume_schedule(self, schedule_id: Id) -> Schedule:
        """Fire its slots again from now on (those that fell while paused are skipped)."""
        return self._send(calls.schedule_call(schedule_id, "resume"))

    def delete_schedule(self, schedule_id: Id) -> None:
        """Delete the schedule; the runs it made stay."""
        self._send(calls.delete_schedule(schedule_id))

    # --- batches and tools -----------------------------------------------------------------

    def submit_batch(
        self,
        runs: Sequence[BatchItem | Mapping[str, Any]],
        *,
        callback_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> Batch:
        """Submit runs as one graph (all admitted or none); the batch with ``run_ids``."""
        return self._send(calls.submit_batch(runs, callback_url, idempotency_key))

    def get_batch(self, batch_id: Id) -> Batch:
        """One batch with its runs."""
        return self._send(calls.get_batch(batch_id))

    def list_batches(
        self, *, page_size: int = 20, limit: int | None = None
    ) -> Iterator[BatchSummary]:
        """Every batch of yours, newest first, page after page (up to ``limit``)."""
        return self._walk(calls.batch_pager(page_size, limit))

    def wait_batch(
        self, batch_id: Id, timeout: float | None = None, *, poll_seconds: float = 1.0
    ) -> Batch:
        """Wait until none of the batch's runs is queued or running (long-polling
        ``GET /v1/batches/{id}?wait=`` in slices of at most 30 s, ``poll_seconds`` apart at
        least when the API answers at once); ``WaitTimeoutError`` after ``timeout`` s."""
        return self._poll(waiting_batch(batch_id, timeout, self._config.retry, poll_seconds))

    def cancel_batch(self, batch_id: Id) -> Batch:
        """Cancel the batch's queued runs and ask its running ones to stop."""
        return self._send(calls.cancel_batch(batch_id))

    def retry_batch(self, batch_id: Id) -> Batch:
        """New runs for every ref that did not succeed, wired to the ones that did."""
        return self._send(calls.retry_batch(batch_id))

    def tools(self) -> builtins.list[Tool]:
        """The registered tools with their limits and input schemas."""
        return self._send(calls.tools())

    # --- builds and tenants (admin keys) --------------------------------------------------

    def build_tool(self, tool: str, *, force: bool = False) -> BuildRequested:
        """Queue the build of a tool built from source on every engine with a live worker
        of its queue, ahead of runs or after a failure (``force``: also where it is ready);
        an admin key."""
        return self._send(calls.build_tool(tool, force))

    def list_builds(
        self, *, tool: str | None = None, status: str | None = None, limit: int = 100
    ) -> builtins.list[Build]:
        """Builds, newest first, without their logs (``status``: queued, building, ready
        or failed)."""
        return self._send(calls.list_builds(tool, status, limit))

    def get_build(self, build_id: Id) -> Build:
        """One build with its log's tail."""
        return self._send(calls.get_build(build_id))

    def get_usage(
        self,
        *,
        first: date | None = None,
        last: date | None = None,
        group_by: str = "tool",
        tenant: str | None = None,
    ) -> UsageReport:
        """Usage (CPU seconds, memory, wall time, disk and network bytes) summed by ``tool``,
        ``day`` or ``tenant`` over whole UTC days from ``first`` to ``last`` (this month by
        default): the key's tenant's own; an admin key's of every tenant, or of ``tenant``."""
        return self._send(calls.get_usage(first, last, group_by, tenant))

    def get_tenant_webhook(self, tenant: str) -> TenantWebhook:
        """A tenant's default webhook URL and whether it has a signing secret (never the
        secret); an admin key."""
        return self._send(calls.get_tenant_webhook(tenant))

    def set_tenant_webhook(
        self,
        tenant: str,
        url: str | None,
        *,
        rotate_secret: bool = False,
        events: Sequence[str] | None = None,
        deadline_lead_seconds: int | None = None,
    ) -> TenantWebhook:
        """Set a tenant's default webhook URL (None: no default) and, when given, the events
        it receives (``run.started``, ``run.deadline_approaching``, ``run.completed``) and how
        many seconds before an attempt's deadline the notice goes; the answer that makes a
        signing secret (the first, or ``rotate_secret``) carries it, this once. An admin key."""
        return self._send(
            calls.set_tenant_webhook(tenant, url, rotate_secret, events, deadline_lead_seconds)
        )

    # --- I/O -------------------------------------------------------------------------------

    # --- sandboxes ---

    def create_sandbox(
        self,
        tool: str,
        *,
        ttl_seconds: int | None = None,
        idle_timeout_seconds: int | None = None,
        max_execs: int | None = None,
        limits: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        idempotency_key: str | None = None,
    ) -> Sandbox:
        """A sandbox of ``tool`` (its entry says ``sandbox = true``); with ``wait``, once its
        container runs. ``with`` it to delete it on the way out. It is sent
        with an idempotency key (a fresh one unless given), so a retried request never
        makes a second sandbox."""
        call = sandbox_calls.create_sandbox(
            tool,
            ttl_seconds=ttl_seconds,
            idle_timeout_seconds=idle_timeout_seconds,
            max_execs=max_execs,
            limits=limits,
            env=env,
            idempotency_key=idempotency_key or calls.new_idempotency_key(),
        )
        box = Sandbox(self, self._send(call))
        if wait:
            box.wait_running()
        return box

    def sandbox(self, sandbox_id: Id) -> Sandbox:
        """A handle on an existing sandbox."""
        return Sandbox(self, self._send(sandbox_calls.get_sandbox(sandbox_id)))

    def list_sandboxes(self, limit: int = 50) -> builtins.list[SandboxInfo]:
        """The caller's newest sandboxes."""
        return self._send(sandbox_calls.list_sandboxes(limit)).sandboxes

    def _answer(self, call: Call[T]) -> T:
        """One try of ``call``: its parsed answer, or the error it failed with."""
        try:
            response = self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                content=call.content,
                headers=call.headers,
                timeout=self._config.call_timeout(call),
            )
        except httpx2.TransportError as exc:
            raise transport_error(exc) from exc
        if response.status_code >= 400:
            raise error_of(response)
        return call.parse(response)

    def _send(self, call: Call[T]) -> T:
        attempts = Attempts(self._config.retry, safe=call.safe, what=f"{call.method} {call.path}")
        while True:
            try:
                return self._answer(call)
            except RunyardError as error:
                time.sleep(attempts.failed(error))

    def _poll(self, poll: LongPoll[T]) -> T:
        while (call := poll.next_call()) is not None:
            try:
                pause = poll.answered(self._answer(call))
            except RunyardError as error:
                pause = poll.failed(error)
            time.sleep(pause)
        return poll.result()

    def _walk(self, pager: Pager[Any, I]) -> Iterator[I]:
        while (call := pager.next_call()) is not None:
            yield from pager.take(self._send(call))

    def _follow(self, follow: EventFollow) -> Generator[Event]:
        while not follow.done:
            try:
                with self._http.sse(
                    follow.path,
                    headers=follow.headers(),
                    timeout=self._config.read_timeout(follow.read_seconds()),
                    max_event_size=MAX_EVENT_BYTES,
                ) as source:
                    if source.response.status_code >= 400:
                        source.response.read()
                        raise error_of(source.response)
                    follow.connected(source.response.status_code)
                    for message in () if follow.done else source:
                        event = follow.receive(
                            message.id, message.event, message.data, message.retry
                        )
                        if event is not None:
                            yield event
                            if follow.done:
                                break
            except httpx2.SSEError as exc:
                raise stream_error(exc) from exc
            except httpx2.TransportError as exc:
                pause = follow.failed(transport_error(exc))
            except RunyardError as error:
                pause = follow.failed(error)
            else:
                pause = follow.ended()
            time.sleep(pause)

    def _fetch(self, artifact: Artifact, target: Path) -> Path:
        file = VerifiedFile(target, artifact)
        attempts = Attempts(self._config.retry, safe=True, what=f"GET {artifact.url}")
        try:
            while True:
                try:
                    with self._http.stream(
                        "GET", artifact.url, headers=file.request_headers()
                    ) as response:
                        if response.status_code >= 400:
                            response.read()
                            raise error_of(response)
                        file.begin(response.status_code, response.headers)
                        for chunk in response.iter_bytes(CHUNK_BYTES):
                            file.write(chunk)
                            attempts.progressed()
                    return file.finish()
                except httpx2.TransportError as exc:
                    time.sleep(attempts.failed(transport_error(exc)))
                except RunyardError as error:
                    time.sleep(attempts.failed(error))
        except BaseException:
            file.discard()
            raise
