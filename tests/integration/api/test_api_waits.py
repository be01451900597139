"""Long-polls of the reads: ``GET /v1/runs/{id}?wait=S`` and ``GET /v1/batches/{id}?wait=S``
answer as soon as the run (batch) is terminal, or after S seconds as it is then; the test
drives the runs through the queue's own statements."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.platform.db import DbTimeouts, make_engine
from runyard.queue import ApiQueue, ClaimedJob, JobQueue
from runyard.reads.runs import RunReader
from runyard.registry.tools import ToolRegistry
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import bearer, live_server, make_app, wait_until
from tests.integration.api.test_api_sync_mode import SYNC, Gate
from tests.integration.api.test_api_workflows import SUCCESS, finish_claimable

# The safety re-read is this far away: only a notification can end a wait in time.
NO_POLL: dict[str, Any] = {"events_poll_seconds": 30}


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry, **NO_POLL)) as test_client:
        yield test_client


@pytest.fixture
def acme(engine: Engine) -> dict[str, str]:
    return bearer(engine, "acme")


def submit(client: TestClient, headers: dict[str, str], **body: Any) -> str:
    response = client.post("/v1/runs", json={"tool": "echo", "input": {}, **body}, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def claim(queue: JobQueue) -> list[ClaimedJob]:
    """Claim every claimable job: their runs are running."""
    return queue.claim(worker_id="w", engine_id="e", limit=100, lease_seconds=30)


def timed(call: Callable[[], httpx2.Response]) -> tuple[httpx2.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def finished_while_held(
    client: TestClient, path: str, headers: dict[str, str], finish: Callable[[], object]
) -> tuple[httpx2.Response, float]:
    """Ask ``path`` (a long-poll of 20 s), end what it waits for once the request sleeps; the
    answer, and how long after the end it came."""
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.get, path, headers=headers)
        time.sleep(0.5)  # the request is now asleep on its subscription
        assert not waiting.done()
        finish()
        ended_at = time.monotonic()
        response = waiting.result(timeout=25)
    return response, time.monotonic() - ended_at


# --- a run ---


def test_get_run_wait__a_terminal_run_is_answered_at_once(client, acme, queue):
    run_id = submit(client, acme)
    assert finish_claimable(queue) == {run_id}
    response, took = timed(lambda: client.get(f"/v1/runs/{run_id}?wait=20", headers=acme))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded" and response.json()["result"] == {"ok": 1}
    assert took < 5


def test_get_run_wait__a_run_that_ends_during_the_wait_is_answered_on_its_notification(
    client, acme, queue
):
    run_id = submit(client, acme)
    [job] = claim(queue)
    response, after_end = finished_while_held(
        client,
        f"/v1/runs/{run_id}?wait=20",
        acme,
        lambda: queue.finalize(job.job_id, job.lease_token, SUCCESS),
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"
    assert after_end < 5  # the safety re-read was 30 s away, the wait 20 s


def test_get_run_wait__ends_after_its_seconds_with_the_run_still_running(client, acme, queue):
    run_id = submit(client, acme)
    [job] = claim(queue)
    response, took = timed(lambda: client.get(f"/v1/runs/{run_id}?wait=0.5", headers=acme))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "running" and response.json()["attempts"] == 1
    assert 0.5 <= took < 5
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS)


def test_get_run_wait__is_capped_by_max_wait_seconds(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    app = make_app(database_url, engine, registry, max_wait_seconds=0.2, **NO_POLL)
    with TestClient(app) as client:
        run_id = submit(client, acme)
        response, took = timed(lambda: client.get(f"/v1/runs/{run_id}?wait=3600", headers=acme))
    assert response.status_code == 200
    assert response.json()["status"] == "queued"
    assert 0.2 <= took < 1.5


def test_get_run_wait__another_tenants_run_is_404_at_once(client, acme, engine):
    run_id = submit(client, acme)
    other = bearer(engine, "globex")
    response, took = timed(lambda: client.get(f"/v1/runs/{run_id}?wait=20", headers=other))
    assert response.status_code == 404
    assert response.json()["code"] == "run_not_found"
    assert took < 5
    admin = bearer(engine, "ops", admin=True)
    seen = client.get(f"/v1/runs/{run_id}?wait=0.1", headers=admin)
    assert seen.status_code == 200 and seen.json()["id"] == run_id


def test_get_run_wait__a_client_that_hangs_up_ends_its_wait(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    app = make_app(database_url, engine, registry, **NO_POLL)
    with live_server(app) as url:
        with httpx2.Client(base_url=url, timeout=10) as http:
            run_id = http.post("/v1/runs", json={"tool": "echo"}, headers=acme).json()["id"]
        notifier = app.state.services.notifier
        with httpx2.Client(base_url=url, timeout=0.5) as impatient:
            with pytest.raises(httpx2.ReadTimeout):
                impatient.get(f"/v1/runs/{run_id}?wait=20", headers=acme)
        wait_until(lambda: notifier.subscriber_count == 0, timeout=5)


def test_get_run_wait__in_sync_mode_a_read_waits_for_the_inline_run(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    gate = Gate()
    app = make_app(database_url, engine, registry, FakeRunner(gate), **SYNC, **NO_POLL)
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:
        with ThreadPoolExecutor(2) as pool:
            inline = pool.submit(http.post, "/v1/runs", json={"tool": "echo"}, headers=acme)
            assert gate.started.acquire(timeout=10)
            [run] = http.get("/v1/runs", headers=acme).json()["items"]
            waiting = pool.submit(http.get, f"/v1/runs/{run['id']}?wait=20", headers=acme)
            time.sleep(0.5)
            assert not waiting.done()
            gate.release.set()
            released_at = time.monotonic()
            response = waiting.result(timeout=25)
            after_end = time.monotonic() - released_at
            assert inline.result(timeout=10).json()["status"] == "succeeded"
    assert response.status_code == 200 and response.json()["status"] == "succeeded"
    assert after_end < 5


@pytest.mark.parametrize("path", ["/v1/runs/{id}", "/v1/batches/{id}"])
@pytest.mark.parametrize("wait", ["-1", "nan", "inf", "3601", "soon"])
def test_get_wait__bad_values_are_422_naming_wait(client, acme, path: str, wait: str):
    url = path.format(id="00000000-0000-4000-8000-000000000000")
    response = client.get(url, params={"wait": wait}, headers=acme)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "validation_error"
    assert response.json()["field"] == "wait"


def test_openapi__the_reads_share_the_submits_wait_parameter(client):
    paths = client.get("/openapi.json").json()["paths"]

    def wait_of(path: str, method: str) -> dict[str, Any]:
        operation = paths[path][method]
        [parameter] = [p for p in operation["parameters"] if p["name"] == "wait"]
        return dict(parameter)

    submit_wait = wait_of("/v1/runs", "post")
    assert paths["/v1/runs/{run_id}"]["get"]["operationId"] == "getRun"
    assert paths["/v1/batches/{batch_id}"]["get"]["operationId"] == "getBatch"
    assert wait_of("/v1/runs/{run_id}", "get") == submit_wait
    assert wait_of("/v1/batches/{batch_id}", "get") == submit_wait
    assert "RUNYARD_MAX_WAIT_SECONDS" in submit_wait["description"]
    assert submit_wait["schema"]["maximum"] == 3600


# --- a submit that waits ---


def test_submit_wait__a_run_that_ends_before_the_request_sleeps_is_heard(
    client, acme, queue, monkeypatch
):
    # A worker this fast: the run ends between its insert and the submit's answer reaching
    # the request, before anything is read. Only a subscription made before the insert hears it.
    submit_run = ApiQueue.submit

    def submit_then_end(self: ApiQueue, *args: Any, **kwargs: Any) -> Any:
        result = submit_run(self, *args, **kwargs)
        assert finish_claimable(queue) == {str(result.run_id)}
        return result

    monkeypatch.setattr(ApiQueue, "submit", submit_then_end)
    response, took = timed(
        lambda: client.post("/v1/runs?wait=20", json={"tool": "echo"}, headers=acme)
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded" and response.json()["result"] == {"ok": 1}
    assert took < 10  # the safety re-read was 30 s away, the wait 20 s


def test_submit_wait__reads_the_run_once_its_end_is_heard_and_not_before(
    client, acme, queue, monkeypatch
):
    reads: list[str] = []
    view = RunReader.view

    def counted(self: RunReader, run_id: Any, *args: Any) -> Any:
        reads.append(str(run_id))
        return view(self, run_id, *args)

    monkeypatch.setattr(RunReader, "view", counted)
    # Connected first: a LISTEN link that comes up later wakes every waiter to re-read.
    notifier = client.app.state.services.notifier
    wait_until(notifier.connected.is_set, timeout=10)
    jobs: list[ClaimedJob] = []
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.post, "/v1/runs?wait=20", json={"tool": "echo"}, headers=acme)

        def claimed() -> bool:
            jobs.extend(claim(queue))
            return bool(jobs)

        wait_until(claimed, timeout=10)
        time.sleep(0.5)  # the request is now asleep on its subscription
        assert reads == [] and not waiting.done()
        [job] = jobs
        assert queue.finalize(job.job_id, job.lease_token, SUCCESS)
        response = waiting.result(timeout=25)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"
    assert reads == [response.json()["id"]]


def test_submit_wait__a_replayed_key_waits_for_the_run_it_made_first(client, acme, queue):
    key = {**acme, "Idempotency-Key": "wait-replay-1"}
    first = client.post("/v1/runs", json={"tool": "echo"}, headers=key)
    assert first.status_code == 202, first.text
    [job] = claim(queue)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.post, "/v1/runs?wait=20", json={"tool": "echo"}, headers=key)
        time.sleep(0.5)  # the request is now asleep on its subscription
        assert not waiting.done()
        assert queue.finalize(job.job_id, job.lease_token, SUCCESS)
        ended_at = time.monotonic()
        response = waiting.result(timeout=25)
    assert response.status_code == 200, response.text
    assert response.json()["id"] == first.json()["id"]
    assert response.json()["status"] == "succeeded"
    assert time.monotonic() - ended_at < 10  # on its notification: the re-read was 30 s away


# --- a batch ---


def submit_batch(client: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    body = {
        "runs": [{"ref": "a", "tool": "echo"}, {"ref": "b", "tool": "echo", "depends_on": ["a"]}]
    }
    response = client.post("/v1/batches", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return dict(response.json())


def test_get_batch_wait__answers_when_its_last_run_ends_not_before(client, acme, queue):
    batch = submit_batch(client, acme)
    path = f"/v1/batches/{batch['id']}?wait=20"
    assert finish_claimable(queue) == {batch["run_ids"]["a"]}
    halfway, took = timed(lambda: client.get(f"/v1/batches/{batch['id']}?wait=0.5", headers=acme))
    assert halfway.status_code == 200 and halfway.json()["status"] == "running"
    assert 0.5 <= took < 5
    response, after_end = finished_while_held(client, path, acme, lambda: finish_claimable(queue))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "succeeded" and body["counts"] == {"succeeded": 2}
    assert [run["ref"] for run in body["runs"]] == ["a", "b"]
    assert after_end < 5
    again, took = timed(lambda: client.get(path, headers=acme))
    assert again.json() == body and took < 5


def test_get_batch_wait__another_tenants_batch_is_404_at_once(client, acme, engine):
    batch = submit_batch(client, acme)
    other = bearer(engine, "globex")
    response, took = timed(lambda: client.get(f"/v1/batches/{batch['id']}?wait=20", headers=other))
    assert response.status_code == 404 and response.json()["code"] == "batch_not_found"
    assert took < 5


# --- many waiters ---


def test_waits__many_waiters_hold_no_connection_and_leave_the_pool_to_others(
    database_url: str, registry: ToolRegistry, engine: Engine, queue: JobQueue
):
    """Twenty long-polls (reads and submits) on a pool of two connections: while they wait
    none is checked out, other requests are served, and every waiter gets its answer."""
    acme = bearer(engine, "acme")
    small = make_engine(
        database_url, pool_size=2, max_overflow=0, timeouts=DbTimeouts(pool_seconds=2)
    )
    app = make_app(database_url, small, registry, **NO_POLL)
    try:
        with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:
            runs = [
                http.post("/v1/runs", json={"tool": "echo"}, headers=acme).json()["id"]
                for _ in range(4)
            ]
            waiters: list[Future[httpx2.Response]] = []
            with ThreadPoolExecutor(20) as pool:
                for n in range(16):
                    path = f"/v1/runs/{runs[n % 4]}?wait=20"
                    waiters.append(pool.submit(http.get, path, headers=acme))
                for _ in range(4):
                    body = {"tool": "echo"}
                    waiters.append(
                        pool.submit(http.post, "/v1/runs?wait=20", json=body, headers=acme)
                    )
                notifier = app.state.services.notifier
                # Every waiter subscribed (then it reads once, and sleeps).
                wait_until(lambda: notifier.subscriber_count == 20, timeout=20)
                wait_until(lambda: small.pool.checkedout() == 0, timeout=10)  # type: ignore[attr-defined]
                time.sleep(0.5)
                assert not any(waiter.done() for waiter in waiters)
                assert small.pool.checkedout() == 0  # type: ignore[attr-defined]
                listed = http.get("/v1/runs", headers=acme)
                assert listed.status_code == 200 and len(listed.json()["items"]) == 8
                finished: set[str] = set()
                deadline = time.monotonic() + 20
                while len(finished) < 8 and time.monotonic() < deadline:
                    finished |= finish_claimable(queue)
                    time.sleep(0.05)
                answers = [waiter.result(timeout=25) for waiter in waiters]
    finally:
        small.dispose()
    assert [answer.status_code for answer in answers] == [200] * 20
    assert {answer.json()["status"] for answer in answers} == {"succeeded"}
