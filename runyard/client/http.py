"""The HTTP client behind ``runyard submit | get | ls | logs | cancel | rm | tools | webhook |
artifacts``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import httpx2

from runyard.client.sse import SseEvent, SseParser

TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
# Each long-poll asks the API to hold the answer this long (it caps it at its own
# RUNYARD_MAX_WAIT_SECONDS); short enough for proxies that cut idle connections.
WAIT_SLICE_SECONDS = 30.0
# How long a wait or a follow keeps retrying while the API cannot be reached.
RECONNECT_SECONDS = 60.0
RETRYABLE_STATUS = (502, 503, 504)


class ClientError(Exception):
    """The API answered with an error (``status``), or could not be reached (no status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unreachable(self) -> bool:
        """No HTTP answer at all (connection refused, reset, timed out)."""
        return self.status is None


class RunyardClient:
    """A thin client of the ``/v1`` API."""

    def __init__(self, url: str, api_key: str | None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx2.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self._timeout = timeout
        # Events the SSE parser dropped for their size, over every stream followed.
        self.dropped_events = 0

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx2.HTTPError as exc:
            raise ClientError(f"cannot reach the runyard API: {exc}") from exc
        if response.status_code >= 400:
            raise _problem(response)
        return response

    def submit(
        self,
        tool: str,
        value: Any,
        *,
        wait: float = 0,
        idempotency_key: str | None = None,
        callback_url: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """POST a run (``extra``: more fields of the body, e.g. ``depends_on``, ``run_at``);
        with ``wait`` the API holds the answer up to that many seconds.

        No read timeout: in sync mode the answer comes when the run ends, and hanging up
        would cancel it.
        """
        params = {"wait": wait} if wait else {}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = self._call(
            "POST",
            "/v1/runs",
            json={"tool": tool, "input": value}
            | ({"callback_url": callback_url} if callback_url else {})
            | (extra or {}),
            params=params,
            headers=headers,
            timeout=httpx2.Timeout(self._timeout, read=None),
        )
        return dict(body.json())

    def submit_and_wait(
        self,
        tool: str,
        value: Any,
        idempotency_key: str,
        *,
        on_update: Callable[[dict[str, Any]], None] = lambda run: None,
        wait_slice: float = WAIT_SLICE_SECONDS,
        reconnect_seconds: float = RECONNECT_SECONDS,
        callback_url: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Submit, then long-poll until the run is terminal; returns the final run.

        Every poll after the first answer is the same POST with the same ``Idempotency-Key``
        and ``?wait=``: the API answers with the run the key already names and holds the
        answer until the run ends or the wait is over. The key also makes a retry after a
        dropped connection safe.
        """
        # The first answer comes at once, so the caller knows the run id while it waits.
        run = self.submit(
            tool, value, idempotency_key=idempotency_key, callback_url=callback_url, extra=extra
        )
        on_update(run)
        trouble_since: float | None = None
        while run["status"] not in TERMINAL:
            try:
                run = self.submit(
                    tool,
                    value,
                    wait=wait_slice,
                    idempotency_key=idempotency_key,
                    callback_url=callback_url,
                    extra=extra,
                )
            except ClientError as exc:
                if not (exc.unreachable or exc.status in RETRYABLE_STATUS):
                    raise
                trouble_since = trouble_since or time.monotonic()
                if time.monotonic() - trouble_since > reconnect_seconds:
                    raise
                time.sleep(1.0)
                continue
            trouble_since = None
            on_update(run)
        return run

    def rerun(self, run_id: str) -> dict[str, Any]:
        """A new run of the same tool and input."""
        return dict(self._call("POST", f"/v1/runs/{run_id}/rerun").json())

    def submit_batch(self, body: Any, idempotency_key: str | None = None) -> dict[str, Any]:
        """POST a batch (``{"runs": [...]}``); the batch with the run id of every ref."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return dict(self._call("POST", "/v1/batches", json=body, headers=headers).json())

    def batch(self, batch_id: str) -> dict[str, Any]:
        """One batch."""
        return dict(self._call("GET", f"/v1/batches/{batch_id}").json())

    def batch_action(self, batch_id: str, action: str) -> dict[str, Any]:
        """``cancel`` or ``retry`` a batch."""
        return dict(self._call("POST", f"/v1/batches/{batch_id}/{action}").json())

    def event_lines(self, run_id: str) -> Iterator[str]:
        """The run's whole event log so far, one NDJSON line at a time."""
        params = {"format": "ndjson"}
        try:
            with self._http.stream(
                "GET", f"/v1/runs/{run_id}/events", params=params, timeout=self._timeout
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _problem(response)
                yield from response.iter_lines()
        except httpx2.HTTPError as exc:
            raise ClientError(f"cannot reach the runyard API: {exc}") from exc

    def get(self, run_id: str) -> dict[str, Any]:
        """One run."""
        return dict(self._call("GET", f"/v1/runs/{run_id}").json())

    def runs(self, **filters: Any) -> dict[str, Any]:
        """A page of runs."""
        params = {k: v for k, v in filters.items() if v is not None}
        return dict(self._call("GET", "/v1/runs", params=params).json())

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a run."""
        return dict(self._call("POST", f"/v1/runs/{run_id}/cancel").json())

    def delete(self, run_id: str) -> None:
        """Delete a terminal run with everything that belongs to it."""
        self._call("DELETE", f"/v1/runs/{run_id}")

    def set_webhook(self, tenant: str, url: str | None, *, rotate_secret: bool) -> dict[str, Any]:
        """Set a tenant's default webhook URL (admins); a new secret comes back once."""
        body = {"url": url, "rotate_secret": rotate_secret}
        return dict(self._call("PUT", f"/v1/tenants/{tenant}/webhook", json=body).json())

    def artifacts(self, run_id: str) -> dict[str, Any]:
        """A terminal run's artifact list (path, size, sha256, url)."""
        return dict(self._call("GET", f"/v1/runs/{run_id}/artifacts").json())

    def download(self, url: str, sink: Callable[[bytes], object]) -> None:
        """Stream the body of ``url`` (a path under the API) into ``sink``, piece by piece."""
        try:
            with self._http.stream("GET", url) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _problem(response)
                for piece in response.iter_bytes():
                    sink(piece)
        except httpx2.HTTPError as exc:
            raise ClientError(f"cannot reach the runyard API: {exc}") from exc

    def logs(self, run_id: str, stream: str = "both") -> str:
        """The stored output of a run."""
        return self._call("GET", f"/v1/runs/{run_id}/logs", params={"stream": stream}).text

    def tools(self) -> list[dict[str, Any]]:
        """The registered tools."""
        tools: list[dict[str, Any]] = self._call("GET", "/v1/tools").json()
        return tools

    def build(self, tool: str, *, force: bool = False) -> dict[str, Any]:
        """Ask for a tool's build ahead of runs, or again after a failure (admin)."""
        params = {"force": "true"} if force else {}
        return dict(self._call("POST", f"/v1/tools/{tool}/build", params=params).json())

    def builds(self, **filters: Any) -> list[dict[str, Any]]:
        """Builds, newest first (``tool``, ``status``, ``limit``)."""
        params = {k: v for k, v in filters.items() if v is not None}
        found: list[dict[str, Any]] = self._call("GET", "/v1/builds", params=params).json()
        return found

    def get_build(self, build_id: str) -> dict[str, Any]:
        """One build with its log's tail."""
        return dict(self._call("GET", f"/v1/builds/{build_id}").json())

    def events(
        self, run_id: str, *, reconnect_seconds: float = RECONNECT_SECONDS
    ) -> Iterator[SseEvent]:
        """Follow the run's event stream until it ends, reconnecting with Last-Event-ID.

        Gives up with a ``ClientError`` once the API has been unreachable for
        ``reconnect_seconds`` in a row.
        """
        last_id = ""
        retry_seconds = 1.0
        trouble_since: float | None = None
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            parser = SseParser()
            try:
                with self._http.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise _problem(response)
                    trouble_since = None
                    for chunk in _chunks(response, parser):
                        self.dropped_events += parser.dropped
                        parser.dropped = 0
                        for event in chunk:
                            last_id = event.id or last_id
                            yield event
                            if _is_terminal(event):
                                return
            except httpx2.TransportError as exc:
                trouble_since = trouble_since or time.monotonic()
                if time.monotonic() - trouble_since > reconnect_seconds:
                    raise ClientError(f"cannot reach the runyard API: {exc}") from exc
            else:
                # The stream ended without the terminal event (streams are bounded in time).
                if self.get(run_id)["status"] in TERMINAL:
                    return
            if parser.retry_ms is not None:
                retry_seconds = min(max(parser.retry_ms / 1000, 0.1), 30.0)
            time.sleep(retry_seconds)


def _chunks(response: httpx2.Response, parser: SseParser) -> Iterator[list[SseEvent]]:
    for data in response.iter_bytes():
        yield parser.feed(data)
    yield parser.close()


def _is_terminal(event: SseEvent) -> bool:
    if event.type != "status":
        return False
    payload = event.payload()
    return payload is not None and payload.get("status") in TERMINAL


def _problem(response: httpx2.Response) -> ClientError:
    """The error an answer of 400 or more stands for."""
    try:
        problem = response.json()
        detail = problem.get("detail") or problem.get("title")
        message = f"{response.status_code} {problem.get('code', '')}: {detail}"
    except (ValueError, AttributeError):
        message = f"{response.status_code}: {response.text[:200]}"
    return ClientError(message, response.status_code)


def follow_logs(client: RunyardClient, run_id: str, out: TextIO, err: TextIO) -> tuple[str, int]:
    """Write stdout/stderr chunks as they arrive; the final status and events skipped.

    Events of other types, and events whose data is not what a log or status event
    carries, are passed over.
    """
    status = str(client.get(run_id)["status"])
    skipped = 0
    for event in client.events(run_id):
        payload = event.payload()
        if event.type in ("stdout", "stderr"):
            text = None if payload is None else payload.get("text")
            if not isinstance(text, str):
                skipped += 1
                continue
            target = out if event.type == "stdout" else err
            target.write(text)
            target.flush()
        elif event.type == "status":
            value = None if payload is None else payload.get("status")
            if isinstance(value, str):
                status = value
            else:
                skipped += 1
    return status, skipped
