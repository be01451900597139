"""Flow control against Postgres: held jobs, the gate that releases them within the limits of
their tool, tenant and concurrency key, with many claimers at once; the submit buckets."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

import runyard.queue.flow
from runyard.domain.attempt import AttemptResult
from runyard.domain.flow_limits import Limit
from runyard.domain.states import RunStatus
from runyard.platform.db import autocommit
from runyard.queue import AdmissionCaps, ApiQueue, JobQueue
from runyard.queue.flow import FlowGate, SubmitRates
from runyard.queue.flow_sql import ANY_HELD, HELD_SCOPES
from runyard.reads.runs import RunReader
from runyard.registry.tools import FlowSpec, ToolRegistry
from runyard.submission.request import RunRequest

DONE = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={})
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def limited(registry: ToolRegistry, tenant: Limit | None = None, **flow: Any) -> ToolRegistry:
    """The registry with ``echo`` under ``flow`` (and each tenant under ``tenant``)."""
    echo = registry.tools["echo"].model_copy(update={"flow": FlowSpec(**flow)})
    return dataclasses.replace(
        registry, tools={**registry.tools, "echo": echo}, tenant_flow=tenant or Limit()
    )


def submit(
    engine: Engine, registry: ToolRegistry, n: int = 1, *, key: str | None = None, **more: Any
) -> list[Any]:
    queue = ApiQueue(engine)
    made = []
    for _ in range(n):
        request = RunRequest(more.get("tenant", "acme"), "echo", {}, concurrency_key=key)
        made.append(queue.submit(request.prepare(registry), AdmissionCaps()).run_id)
    return made


def claimer(engine: Engine, registry: ToolRegistry) -> JobQueue:
    return JobQueue(engine, flow=FlowGate(engine, registry.flow_config))


def claim(queue: JobQueue, limit: int = 10, now: datetime | None = None) -> list[Any]:
    return queue.claim(worker_id="w", engine_id="e", limit=limit, lease_seconds=30, now=now)


def running_of_key(engine: Engine, key: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM tool_runs WHERE concurrency_key = :key"
                    " AND status = 'running'"
                ),
                {"key": key},
            ).scalar_one()
        )


def test_submit__a_limited_run_is_held_says_why_and_only_the_gate_lets_it_go(engine, registry):
    flows = limited(registry, key_max_running=2)
    held = submit(engine, flows, 1, key="cust-1")[0]
    free = submit(engine, flows)[0]  # no key: echo has no limit of its own
    view = RunReader(engine).view(held, "acme")
    assert view is not None and view.concurrency_key == "cust-1"
    assert view.waiting_for == "its flow limits: concurrency_key cust-1"
    plain = JobQueue(engine)  # a claim without a gate never takes a held job
    assert [job.run_id for job in claim(plain)] == [free]
    assert [job.run_id for job in claim(claimer(engine, flows))] == [held]


def test_gate__releases_a_key_up_to_its_maximum_and_more_as_runs_end(engine, registry):
    flows = limited(registry, key_max_running=2)
    submit(engine, flows, 5, key="cust-1")
    submit(engine, flows, 1, key="cust-2")
    queue = claimer(engine, flows)
    first = claim(queue)
    assert len(first) == 3  # two of cust-1, one of cust-2
    assert claim(queue) == []
    assert queue.finalize(first[0].job_id, first[0].lease_token, DONE)
    assert len(claim(queue)) == 1
    assert running_of_key(engine, "cust-1") == 2


def test_gate__rests_while_nothing_is_held_until_a_held_job_wakes_it(engine, registry):
    flows = limited(registry, key_max_running=2)
    gate = FlowGate(engine, flows.flow_config, rest_seconds=3600)
    assert gate.quiet_for() == 0.0  # never passed yet
    assert gate.release() == 0  # nothing held anywhere: the gate rests
    assert 3500 < gate.quiet_for() <= 3600  # its chore may sleep that long
    submit(engine, flows, 1, key="cust-1")
    assert gate.release() == 0  # resting: no pass, the job stays held
    gate.wake()  # what the held job's notification does
    assert gate.quiet_for() == 0.0
    assert gate.release() == 1


def test_gate__a_rest_that_runs_out_with_nothing_held_costs_one_probe(
    engine, registry, monkeypatch
):
    flows = limited(registry, key_max_running=2)
    gate = FlowGate(engine, flows.flow_config, rest_seconds=0.05)
    asked: list[str] = []

    def recording(engine: Engine, statement: Any, params: Any) -> list[Any]:
        asked.append(statement.text)
        return autocommit(engine, statement, params)

    monkeypatch.setattr(runyard.queue.flow, "autocommit", recording)
    assert gate.release() == 0  # nothing held anywhere: the gate rests
    assert asked == [HELD_SCOPES.text, ANY_HELD.text]
    for _ in range(3):
        asked.clear()
        time.sleep(0.06)
        assert gate.release() == 0
        assert asked == [ANY_HELD.text]  # the probe alone, and the gate rests again
        assert gate.quiet_for() > 0
    submit(engine, flows, 1, key="cust-1")  # held, its notification missed
    time.sleep(0.06)
    assert gate.release() == 1  # the probe finds it: a whole pass


def test_gate__rests_the_longer_period_only_while_it_hears_every_held_job(
    engine, registry, monkeypatch
):
    flows = limited(registry, key_max_running=2)
    gate = FlowGate(engine, flows.flow_config, rest_seconds=0.5, heard_rest_seconds=3600)
    asked: list[str] = []

    def recording(engine: Engine, statement: Any, params: Any) -> list[Any]:
        asked.append(statement.text)
        return autocommit(engine, statement, params)

    monkeypatch.setattr(runyard.queue.flow, "autocommit", recording)
    assert gate.release() == 0
    assert 0 < gate.quiet_for() <= 0.5  # no link: the short rest
    gate.hears_held(True)
    assert gate.quiet_for() == 0.0  # the link is up: look once for a job held before it
    assert gate.release() == 0
    assert 3500 < gate.quiet_for() <= 3600
    asked.clear()
    time.sleep(0.6)
    assert gate.release() == 0 and asked == []  # no probe where the short rest made one
    submit(engine, flows, 1, key="cust-1")  # held while the link is down: not heard
    gate.hears_held(False)
    assert gate.release() == 1  # the loss wakes it, and it finds the job
    assert gate.release() == 0
    assert 0 < gate.quiet_for() <= 0.5  # no link: the short rest again


def test_gate__woken_from_a_rest_it_passes_on_while_jobs_stay_held(engine, registry):
    flows = limited(registry, key_max_running=1)
    gate = FlowGate(engine, flows.flow_config, rest_seconds=3600)
    queue = JobQueue(engine, flow=gate)
    assert gate.release() == 0  # nothing held: a long rest
    submit(engine, flows, 2, key="cust-1")
    gate.wake()
    [first] = claim(queue)  # the woken pass released one; the other waits for the key
    assert queue.finalize(first.job_id, first.lease_token, DONE)
    assert gate.release() == 1  # the rest before the wake-up is over: no second wake needed


def test_gate__jobs_held_behind_a_full_scope_keep_it_passing(engine, registry):
    flows = limited(registry, key_max_running=1)
    submit(engine, flows, 2, key="cust-1")
    gate = FlowGate(engine, flows.flow_config, rest_seconds=3600)
    queue = JobQueue(engine, flow=gate)
    [first] = claim(queue)
    assert gate.release() == 0  # the key is full, one job still held: no rest
    assert queue.finalize(first.job_id, first.lease_token, DONE)
    assert gate.release() == 1  # no wake-up needed


def test_gate__tool_and_tenant_maxima_hold_across_keys(engine, registry):
    flows = limited(registry, tenant=Limit(max_running=3), max_running=4)
    for key in ("a", "b", "c"):
        submit(engine, flows, 2, key=key)
    submit(engine, flows, 3, tenant="globex")
    claimed = claim(claimer(engine, flows), limit=20)
    by_tenant: dict[str, int] = {}
    with engine.connect() as conn:
        for job in claimed:
            tenant = conn.execute(
                text("SELECT tenant FROM tool_runs WHERE id = :id"), {"id": job.run_id}
            ).scalar_one()
            by_tenant[tenant] = by_tenant.get(tenant, 0) + 1
    assert len(claimed) == 4  # the tool's maximum, whatever the tenants
    assert all(count <= 3 for count in by_tenant.values())


def test_gate__a_rate_releases_a_bucket_then_what_time_refills(engine, registry):
    flows = limited(registry, starts_per_second=5)
    submit(engine, flows, 20)
    queue = claimer(engine, flows)
    assert len(claim(queue, 20, now=T0)) == 5  # a full bucket: one second's worth
    assert claim(queue, 20, now=T0) == []
    assert len(claim(queue, 20, now=T0 + timedelta(seconds=0.4))) == 2
    assert len(claim(queue, 20, now=T0 + timedelta(seconds=10))) == 5  # never above a burst


def test_gate__finds_a_key_with_room_behind_a_line_of_held_runs_of_a_full_key(engine, registry):
    flows = limited(registry, key_max_running=1)
    submit(engine, flows, 10, key="busy")
    submit(engine, flows, 1, key="quiet")
    queue = JobQueue(engine, flow=FlowGate(engine, flows.flow_config, batch=5))
    assert len(claim(queue)) == 1  # busy's first; the pass saw busy's runs only
    assert running_of_key(engine, "quiet") == 0
    assert len(claim(queue)) == 1  # busy is full: passing its line over, it finds quiet
    assert running_of_key(engine, "quiet") == 1
    assert claim(queue) == []


def test_gate__limits_removed_since_release_what_they_held(engine, registry):
    submit(engine, limited(registry, key_max_running=1), 3, key="k")
    assert len(claim(claimer(engine, registry), limit=5)) == 3


def test_gate__four_claimers_never_run_more_than_a_keys_maximum(engine, registry):
    flows = limited(registry, key_max_running=2)
    submit(engine, flows, 24, key="hot")
    submit(engine, flows, 8, key="cold")
    stop = threading.Event()
    samples: list[int] = []

    def sample() -> None:
        while not stop.is_set():
            samples.append(running_of_key(engine, "hot"))

    def work(seed: int) -> None:
        queue = claimer(engine, flows)
        pick = random.Random(seed)
        while not stop.is_set():
            for job in claim(queue, limit=2):
                time.sleep(pick.uniform(0, 0.02))
                assert queue.finalize(job.job_id, job.lease_token, DONE)

    sampler = threading.Thread(target=sample)
    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in [sampler, *workers]:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                left = conn.execute(
                    text("SELECT count(*) FROM tool_runs WHERE status <> 'succeeded'")
                ).scalar_one()
            if not left:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in [sampler, *workers]:
            thread.join()
    assert left == 0
    assert len(samples) > 20 and max(samples) == 2


def test_submit_rates__a_bucket_per_tenant(engine):
    rates = SubmitRates(engine, Limit(per_second=2))
    verdicts = [rates.take("acme", now=T0) for _ in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False]
    assert verdicts[2].retry_after_seconds == 1
    assert rates.take("globex", now=T0).allowed
    assert rates.take("acme", now=T0 + timedelta(seconds=0.5)).allowed


@pytest.mark.slow
def test_gate__a_rate_of_five_a_second_holds_within_ten_percent_over_30_seconds(engine, registry):
    flows = limited(registry, starts_per_second=5)
    submit(engine, flows, 200)
    queue = claimer(engine, flows)
    begin = last_round = time.monotonic()
    started = 0
    unasked = 0.0  # seconds past a full bucket between two rounds: starts no gate could give
    while time.monotonic() - begin < 30:
        for job in claim(queue, limit=10):
            started += 1
            assert queue.finalize(job.job_id, job.lease_token, DONE)
        time.sleep(0.05)
        now = time.monotonic()
        unasked += max(0.0, now - last_round - 1.0)  # the bucket (5) fills in a second
        last_round = now
    # A full bucket (5) at the start, then five a second; less only where a busy machine kept
    # this claimer from asking for longer than the bucket takes to fill.
    assert 150 * 0.9 - 5 * unasked <= started - 5 <= 150 * 1.1, (started, unasked)
