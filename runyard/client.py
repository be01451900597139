"""The HTTP client behind ``runyard submit | get | ls | logs | cancel | tools``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import httpx2

TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
EXIT_CODES = {"succeeded": 0, "failed": 1, "timed_out": 3, "cancelled": 4}
SPINNER = "|/-\\"


class ClientError(Exception):
    """The API answered with an error, or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event."""

    id: str
    type: str
    data: dict[str, Any]


class RunyardClient:
    """A thin client of the ``/v1`` API."""

    def __init__(self, url: str, api_key: str | None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx2.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx2.HTTPError as exc:
            raise ClientError(f"cannot reach the runyard API: {exc}") from exc
        if response.status_code >= 400:
            try:
                problem = response.json()
                detail = problem.get("detail") or problem.get("title")
                message = f"{response.status_code} {problem.get('code', '')}: {detail}"
            except ValueError:
                message = f"{response.status_code}: {response.text[:200]}"
            raise ClientError(message, response.status_code)
        return response

    def submit(self, tool: str, value: Any, *, wait: float = 0) -> dict[str, Any]:
        """POST a run; with ``wait`` the API holds the answer up to that many seconds."""
        params = {"wait": wait} if wait else {}
        body = self._call("POST", "/v1/runs", json={"tool": tool, "input": value}, params=params)
        return dict(body.json())

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

    def logs(self, run_id: str, stream: str = "both") -> str:
        """The stored output of a run."""
        return self._call("GET", f"/v1/runs/{run_id}/logs", params={"stream": stream}).text

    def tools(self) -> list[dict[str, Any]]:
        """The registered tools."""
        tools: list[dict[str, Any]] = self._call("GET", "/v1/tools").json()
        return tools

    def events(self, run_id: str) -> Iterator[SseEvent]:
        """Follow the run's event stream until it ends, reconnecting with Last-Event-ID."""
        last_id: str | None = None
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                with self._http.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        self._call("GET", f"/v1/runs/{run_id}")  # raises the problem
                        raise ClientError(f"event stream refused: {response.status_code}")
                    for event in _parse_sse(response.iter_lines()):
                        last_id = event.id or last_id
                        yield event
                        if event.type == "status" and event.data.get("status") in TERMINAL:
                            return
            except httpx2.TransportError:
                time.sleep(1.0)  # the stream dropped: resume where it stopped
                continue
            if self.get(run_id)["status"] in TERMINAL:
                return


def _parse_sse(lines: Iterator[str]) -> Iterator[SseEvent]:
    event_id, event_type = "", "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseEvent(event_id, event_type, json.loads("\n".join(data)))
            event_id, event_type, data = "", "message", []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("event:"):
            event_type = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def follow_logs(client: RunyardClient, run_id: str, out: TextIO = sys.stdout) -> str:
    """Print stdout/stderr chunks as they arrive; return the final status."""
    status = str(client.get(run_id)["status"])
    for event in client.events(run_id):
        if event.type in ("stdout", "stderr"):
            target = out if event.type == "stdout" else sys.stderr
            target.write(str(event.data.get("text", "")))
            target.flush()
        elif event.type == "status":
            status = str(event.data.get("status", status))
    return status


def wait_with_progress(
    client: RunyardClient, run_id: str, out: TextIO, *, interactive: bool
) -> dict[str, Any]:
    """Poll until the run is terminal, showing a spinner on a terminal."""
    started = time.monotonic()
    tick = 0
    while True:
        run = client.get(run_id)
        if run["status"] in TERMINAL:
            if interactive:
                out.write("\r\033[K")
            return run
        if interactive:
            elapsed = time.monotonic() - started
            out.write(f"\r{SPINNER[tick % 4]} {run['status']} {elapsed:5.1f}s")
            out.flush()
        tick += 1
        time.sleep(0.25)
