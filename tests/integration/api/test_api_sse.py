"""Live, resumable SSE over a real server on loopback; a worker with the fake runner drives
the run one step at a time."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import bearer, live_server, make_app, wait_until
from tests.integration.queue.test_events_order import insert
from worker.service import Worker, WorkerConfig


def sse_messages(response: httpx2.Response) -> Iterator[dict[str, Any]]:
    """Parse an event stream into ``{"id", "event", "data"}`` dicts (comments as ``comment``)."""
    block: dict[str, Any] = {}
    for line in response.iter_lines():
        if line == "":
            if block:
                yield block
            block = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            block[key] = json.loads(value) if key == "data" else value


class Steps:
    """A fake tool that writes log chunks when the test says so."""

    def __init__(self) -> None:
        self.gates = [threading.Event() for _ in range(3)]

    def __call__(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        assert control.logs is not None
        for n, chunk in enumerate(("first\n", "second\n")):
            assert self.gates[n].wait(20)
            control.logs.write("stdout", chunk, f"2026-01-01T00:00:0{n}.000000000Z")
        assert self.gates[2].wait(20)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, stdout="first\nsecond\n")


def _db_events(engine: Engine, run_id: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, type FROM tool_run_events WHERE run_id = :id ORDER BY xact_id, id"),
            {"id": run_id},
        ).all()
    return [(str(row.id), row.type) for row in rows]


def test_sse__reconnect_with_last_event_id_mid_run_gets_every_later_event_once(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue
):
    # Safety re-check 30 s away: everything below arrives through NOTIFY.
    app = make_app(database_url, engine, registry, events_poll_seconds=30)
    headers = bearer(engine, "acme")
    steps = Steps()
    worker = Worker(queue, FakeRunner(steps), WorkerConfig(worker_id="w-sse", concurrency=1))
    try:
        with live_server(app) as url, httpx2.Client(base_url=url, timeout=20) as http:
            run_id = http.post("/v1/runs", json={"tool": "echo"}, headers=headers).json()["id"]
            assert worker.run_once().claimed == 1
            events_url = f"/v1/runs/{run_id}/events"

            # First client: reads until the first log chunk, then drops the connection.
            first_client: list[dict[str, Any]] = []
            with http.stream("GET", events_url, headers=headers) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                steps.gates[0].set()
                released = time.monotonic()
                for message in sse_messages(response):
                    if "id" in message:
                        first_client.append(message)
                    if message.get("event") == "stdout":
                        break
            assert time.monotonic() - released < 5  # live, not the 30 s safety poll
            assert first_client[-1]["data"]["text"] == "first\n"
            last_id = first_client[-1]["id"]

            # While nobody listens the tool writes more.
            steps.gates[1].set()
            wait_until(
                lambda: [t for _, t in _db_events(engine, run_id)].count("stdout") == 2,
                timeout=10,
            )

            # Second client resumes mid-run: the backlog, then live events to the end.
            second_client: list[dict[str, Any]] = []

            def follow() -> None:
                with http.stream(
                    "GET", events_url, headers={**headers, "Last-Event-ID": last_id}
                ) as response:
                    assert response.status_code == 200
                    for message in sse_messages(response):
                        if "id" in message:
                            second_client.append(message)
                # The server ended the stream by itself after the terminal event.

            reader = threading.Thread(target=follow)
            reader.start()
            wait_until(lambda: any(m["event"] == "stdout" for m in second_client), timeout=10)
            assert all(
                m["event"] != "status" or m["data"]["status"] == "running" for m in second_client
            )
            steps.gates[2].set()
            reader.join(timeout=15)
            assert not reader.is_alive(), "the stream did not end after the terminal event"
            assert worker.wait_idle(10)
    finally:
        for gate in steps.gates:
            gate.set()
        worker.close()

    everything = _db_events(engine, run_id)
    later = [(i, t) for i, t in everything if int(i) > int(last_id)]
    assert [(m["id"], m["event"]) for m in second_client] == later
    assert [(m["id"], m["event"]) for m in first_client + second_client] == everything
    assert second_client[-1]["event"] == "status"
    assert second_client[-1]["data"]["status"] == "succeeded"
    assert [m["data"]["text"] for m in second_client if m["event"] == "stdout"] == ["second\n"]


def test_sse__idle_stream_sends_keepalives_holds_no_connection_and_is_bounded(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(
        database_url,
        engine,
        registry,
        events_poll_seconds=0.2,
        events_keepalive_seconds=0.2,
        events_max_stream_seconds=1.0,
    )
    headers = bearer(engine, "acme")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=10) as http:
        run_id = http.post("/v1/runs", json={"tool": "echo"}, headers=headers).json()["id"]
        seen: list[dict[str, Any]] = []
        started = time.monotonic()
        with http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as response:
            for message in sse_messages(response):
                seen.append(message)
                if message.get("comment") == "keepalive":
                    # Between wake-ups the stream borrows no database connection.
                    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        # The server closed the stream at events_max_stream_seconds; a client resumes.
        assert 1.0 <= time.monotonic() - started < 5
    assert [m["event"] for m in seen if "id" in m] == ["status"]
    assert any(m.get("comment") == "keepalive" for m in seen)


@pytest.mark.parametrize("older", ["inserts_first", "draws_its_id_last"])
def test_sse__events_committed_out_of_id_order_arrive_once_in_order_across_a_reconnect(
    database_url: str, engine: Engine, registry: ToolRegistry, older: str
):
    # Safety re-check 30 s away: streams wake on NOTIFY and on their own held re-checks.
    app = make_app(database_url, engine, registry, events_poll_seconds=30)
    headers = bearer(engine, "acme")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=20) as http:
        run_id = http.post("/v1/runs", json={"tool": "echo"}, headers=headers).json()["id"]
        events_url = f"/v1/runs/{run_id}/events"

        # One client follows the run the whole time.
        along: list[dict[str, Any]] = []

        def follow() -> None:
            with http.stream("GET", events_url, headers=headers) as response:
                along.extend(m for m in sse_messages(response) if "id" in m)

        follower = threading.Thread(target=follow)
        follower.start()
        queued_id = wait_until(lambda: along and along[0]["id"], timeout=10)

        with engine.connect() as a, engine.connect() as b:
            # Transaction A is older than B; B commits first. A's event id is the smaller
            # one, or (A had its transaction id before it drew an event id) the larger one.
            a_open = a.begin()
            if older == "inserts_first":
                a_id = insert(a, uuid.UUID(run_id), "a")
            else:
                a.execute(text("SELECT pg_current_xact_id()"))
            with b.begin():
                b_id = insert(b, uuid.UUID(run_id), "b")
            if older == "draws_its_id_last":
                a_id = insert(a, uuid.UUID(run_id), "a")
            assert (a_id < b_id) == (older == "inserts_first")

            # A second client connects now: its first read happens before the answer, with
            # B committed and A still open. Then A commits; the client takes one event and
            # drops the connection.
            resumed = {**headers, "Last-Event-ID": queued_id}
            with http.stream("GET", events_url, headers=resumed) as response:
                assert response.status_code == 200
                a_open.commit()
                before_drop = next(m for m in sse_messages(response) if "id" in m)

        # It reconnects with the last id it received: the rest, then the stream's end.
        resumed = {**headers, "Last-Event-ID": before_drop["id"]}
        with http.stream("GET", events_url, headers=resumed) as response:
            assert response.status_code == 200
            cancelled = http.post(f"/v1/runs/{run_id}/cancel", headers=headers)
            assert cancelled.status_code == 202, cancelled.text
            after_drop = [m for m in sse_messages(response) if "id" in m]
        follower.join(timeout=15)
        assert not follower.is_alive(), "the stream did not end after the terminal event"

    in_order = [i for i, _ in _db_events(engine, run_id)]
    assert in_order[1:3] == [str(a_id), str(b_id)]
    assert [m["id"] for m in along] == in_order
    assert [m["id"] for m in [before_drop, *after_drop]] == in_order[1:]
    assert [m["data"].get("text") for m in along[1:3]] == ["a", "b"]
    assert after_drop[-1]["event"] == "status"
    assert after_drop[-1]["data"]["status"] == "cancelled"


def test_sse__an_event_held_by_a_transaction_of_no_run_arrives_before_the_safety_poll(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, events_poll_seconds=30)
    headers = bearer(engine, "acme")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=20) as http:
        run_id = http.post("/v1/runs", json={"tool": "echo"}, headers=headers).json()["id"]
        with engine.connect() as other, engine.connect() as b:
            # An older transaction that writes nothing of this run, so no NOTIFY of the run
            # says when it ends.
            other_open = other.begin()
            other.execute(text("SELECT pg_current_xact_id()"))
            with b.begin():
                held_id = insert(b, uuid.UUID(run_id), "b")
            with http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as response:
                assert response.status_code == 200  # its first read found the event held
                other_open.commit()
                ended = time.monotonic()
                messages = (m for m in sse_messages(response) if "id" in m)
                assert next(messages)["event"] == "status"
                assert next(messages)["id"] == str(held_id)
            assert time.monotonic() - ended < 5  # its own re-check, not the 30 s safety poll
