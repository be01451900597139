"""Workflows against real Postgres: dependencies, propagation, batches, scheduled runs."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.graph import GraphProblem, Node
from runyard.domain.states import ErrorCode, RunStatus
from runyard.maintenance.retention import prune_expired
from runyard.queue import AdmissionCaps, AdmissionRefused, IdempotencyConflict, JobQueue
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter, UnknownDependency
from tests.integration.queue.test_queue import SUCCESS, T0, claim, events, new_run, row

NO_CAPS = AdmissionCaps()
FAILURE = AttemptResult(
    status=RunStatus.FAILED, exit_code=3, error_code=ErrorCode.TOOL_FAILED, error="exit 3"
)


@pytest.fixture
def writer(engine: Engine) -> GraphWriter:
    return GraphWriter(engine)


def batch(writer: GraphWriter, items: list[tuple[str, list[str]]], tenant: str = "acme", **kw):
    runs = [GraphRun(new_run(tenant=tenant), Node(ref, tuple(deps))) for ref, deps in items]
    graph = GraphSubmit(tenant=tenant, runs=runs, batch=True, **kw)
    result = writer.submit(graph, NO_CAPS, now=T0)
    return dict(zip([ref for ref, _ in items], result.run_ids, strict=True)), result


def single(writer: GraphWriter, deps: list[uuid.UUID], tenant: str = "acme", **kw) -> uuid.UUID:
    run_at = kw.pop("run_at", None)
    item = GraphRun(new_run(tenant=tenant), Node(None, tuple(map(str, deps))), run_at=run_at)
    result = writer.submit(GraphSubmit(tenant=tenant, runs=[item], **kw), NO_CAPS, now=T0)
    return result.run_ids[0]


def run_all(
    queue: JobQueue, outcome: AttemptResult = SUCCESS, limit: int = 1000
) -> list[uuid.UUID]:
    """Claim everything claimable now and finalize it with ``outcome``; the claimed run ids."""
    jobs = claim(queue, limit=limit)
    for job in jobs:
        assert queue.finalize(job.job_id, job.lease_token, outcome, now=T0)
    return [job.run_id for job in jobs]


def status(engine: Engine, run_id: uuid.UUID) -> tuple[str, str | None]:
    found = row(engine, run_id)
    return str(found["run_status"]), found["error_code"]  # type: ignore[return-value]


def test_chain__each_run_claimable_only_after_the_previous_succeeded(queue, writer):
    ids, _ = batch(writer, [("a", []), ("b", ["a"]), ("c", ["b"])])
    assert run_all(queue) == [ids["a"]]
    assert run_all(queue) == [ids["b"]]
    assert run_all(queue) == [ids["c"]]
    assert run_all(queue) == []


def test_diamond__the_join_waits_for_both_sides(queue, writer, engine):
    ids, _ = batch(writer, [("top", []), ("l", ["top"]), ("r", ["top"]), ("join", ["l", "r"])])
    assert run_all(queue) == [ids["top"]]
    jobs = claim(queue, limit=10)
    assert {job.run_id for job in jobs} == {ids["l"], ids["r"]}
    assert queue.finalize(jobs[0].job_id, jobs[0].lease_token, SUCCESS, now=T0)
    assert claim(queue, limit=10) == []  # one side still running
    assert queue.finalize(jobs[1].job_id, jobs[1].lease_token, SUCCESS, now=T0)
    assert run_all(queue) == [ids["join"]]
    assert ("dependencies_met", {}) in events(engine, ids["join"])


def test_fan_out_200_and_fan_in_100(queue, writer, engine):
    items: list[tuple[str, list[str]]] = [("root", [])] + [
        (f"leaf{i}", ["root"]) for i in range(200)
    ]
    ids, _ = batch(writer, items)
    assert run_all(queue) == [ids["root"]]
    assert len(run_all(queue)) == 200
    sources: list[tuple[str, list[str]]] = [(f"s{i}", []) for i in range(100)]
    ids, _ = batch(writer, [*sources, ("sink", [ref for ref, _ in sources])])
    first = claim(queue, limit=1000)
    assert len(first) == 100
    for job in first[:-1]:
        assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    assert claim(queue, limit=10) == []
    assert queue.finalize(first[-1].job_id, first[-1].lease_token, SUCCESS, now=T0)
    assert run_all(queue) == [ids["sink"]]


def test_failure__fails_dependents_through_three_levels_naming_the_cause(queue, writer, engine):
    ids, _ = batch(writer, [("a", []), ("b", ["a"]), ("c", ["b"]), ("d", ["c"]), ("x", [])])
    assert set(run_all(queue, FAILURE)) == {ids["a"], ids["x"]}
    for ref in ("b", "c", "d"):
        assert status(engine, ids[ref]) == ("failed", "dependency_failed")
        assert row(engine, ids[ref])["job_status"] == "failed"
    with engine.connect() as conn:
        errors = dict(
            conn.execute(
                text("SELECT ref, error FROM tool_runs WHERE id = ANY(:ids)"),
                {"ids": [ids["b"], ids["c"]]},
            ).all()
        )
    assert errors["b"] == f"dependency {ids['a']} (ref a) ended failed (tool_failed)"
    assert errors["c"] == f"dependency {ids['b']} (ref b) ended failed (dependency_failed)"
    assert ("status", {"status": "failed", "error_code": "dependency_failed"}) in events(
        engine, ids["d"]
    )
    assert claim(queue, limit=10) == []


def test_cancel__of_a_queued_dependency_fails_its_dependents(queue, writer, engine):
    ids, _ = batch(writer, [("a", []), ("b", ["a"]), ("c", ["b"]), ("d", ["c"]), ("e", ["d"])])
    queue.cancel(ids["b"], now=T0)
    assert status(engine, ids["b"]) == ("cancelled", "cancelled")
    for ref in ("c", "d", "e"):
        assert status(engine, ids[ref]) == ("failed", "dependency_failed")
    assert status(engine, ids["a"]) == ("queued", None)


def test_long_chain__failure_at_the_head_settles_all_without_deep_nesting(queue, writer, engine):
    items: list[tuple[str, list[str]]] = [("r0", [])] + [
        (f"r{i}", [f"r{i - 1}"]) for i in range(1, 1000)
    ]
    ids, _ = batch(writer, items)
    assert run_all(queue, FAILURE) == [ids["r0"]]
    with engine.connect() as conn:
        counts = dict(
            conn.execute(
                text(
                    "SELECT error_code, count(*) FROM tool_runs WHERE batch_id IS NOT NULL "
                    "GROUP BY error_code"
                )
            ).all()
        )
    assert counts == {"tool_failed": 1, "dependency_failed": 999}


def test_dependency_on_an_existing_run__waits_or_fails_at_once(queue, writer, engine):
    done = queue.enqueue(new_run(), now=T0).run_id
    failed = queue.enqueue(new_run(), now=T0).run_id
    jobs = claim(queue, limit=2)
    by_run = {job.run_id: job for job in jobs}
    queue.finalize(by_run[done].job_id, by_run[done].lease_token, SUCCESS, now=T0)
    queue.finalize(by_run[failed].job_id, by_run[failed].lease_token, FAILURE, now=T0)
    ready = single(writer, [done])
    doomed = single(writer, [done, failed])
    assert status(engine, doomed) == ("failed", "dependency_failed")
    assert run_all(queue) == [ready]


def test_dependency__of_another_tenant_is_unknown_and_nothing_is_written(queue, writer, engine):
    theirs = queue.enqueue(new_run(tenant="other"), now=T0).run_id
    with pytest.raises(UnknownDependency, match=str(theirs)):
        single(writer, [theirs])
    with pytest.raises(UnknownDependency):
        single(writer, [uuid.uuid4()])
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM tool_runs WHERE tenant = 'acme'")) == 0


@pytest.mark.parametrize(
    ("items", "problem"),
    [
        ([("a", ["b"]), ("b", ["a"])], "cycle"),
        ([("a", []), ("a", [])], "used twice"),
        ([("a", ["nope"])], "neither a ref"),
        ([("a", ["a"])], "itself"),
    ],
)
def test_batch__a_bad_item_admits_nothing(writer, engine, items, problem):
    with pytest.raises(GraphProblem, match=problem):
        batch(writer, items)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM tool_runs")) == 0
        assert conn.scalar(text("SELECT count(*) FROM batches")) == 0


def test_batch__unknown_existing_dependency_rolls_the_batch_back(writer, engine):
    with pytest.raises(UnknownDependency):
        batch(writer, [("a", []), ("b", ["a", str(uuid.uuid4())])])
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM tool_runs")) == 0
        assert conn.scalar(text("SELECT count(*) FROM batches")) == 0


def test_batch__idempotency_key_replays_or_conflicts(writer):
    _, first = batch(writer, [("a", []), ("b", ["a"])], idempotency_key="k1")
    _, again = batch(writer, [("a", []), ("b", ["a"])], idempotency_key="k1")
    assert (again.created, again.batch_id, again.run_ids) == (False, first.batch_id, first.run_ids)
    with pytest.raises(IdempotencyConflict):
        batch(writer, [("a", []), ("b", [])], idempotency_key="k1")


def test_batch__tenant_queued_cap_admits_all_or_none(writer, engine):
    runs = [GraphRun(new_run(), Node(f"r{i}")) for i in range(5)]
    caps = AdmissionCaps(tenant_max_queued=4)
    with pytest.raises(AdmissionRefused):
        writer.submit(GraphSubmit(tenant="acme", runs=runs, batch=True), caps, now=T0)
    writer.submit(GraphSubmit(tenant="acme", runs=runs[:4], batch=True), caps, now=T0)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM tool_runs")) == 4


def test_run_at__not_claimable_before_it(queue, writer):
    later = single(writer, [], run_at=T0 + timedelta(minutes=5))
    past = single(writer, [], run_at=T0 - timedelta(days=1))
    assert [job.run_id for job in claim(queue, limit=10)] == [past]
    assert claim(queue, limit=10, now=T0 + timedelta(minutes=4)) == []
    assert [job.run_id for job in claim(queue, limit=10, now=T0 + timedelta(minutes=5))] == [later]


def submit_dependent(
    writer: GraphWriter, dep: uuid.UUID, barrier: threading.Barrier, made: list[uuid.UUID]
) -> None:
    barrier.wait()
    made.append(single(writer, [dep]))


def test_dependency_ending_while_a_dependent_is_submitted__never_leaves_it_blocked(
    queue, writer, engine
):
    # Many rounds of a dependent submitted at the same moment as its dependency's finalize:
    # whichever commits first, the dependent ends claimable (or already settled).
    for _ in range(30):
        dep = queue.enqueue(new_run(), now=T0).run_id
        (job,) = claim(queue)
        barrier = threading.Barrier(2)
        made: list[uuid.UUID] = []
        thread = threading.Thread(target=submit_dependent, args=(writer, dep, barrier, made))
        thread.start()
        barrier.wait()
        assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
        thread.join()
        with engine.connect() as conn:
            waiting = conn.scalar(
                text("SELECT waiting_on FROM tool_run_jobs WHERE run_id = :id"), {"id": made[0]}
            )
        assert waiting == 0
        assert run_all(queue) == made


def test_claim__brings_what_the_dependencies_returned(queue, writer):
    ids, _ = batch(writer, [("a", []), ("b", []), ("c", ["a", "b"])])
    assert len(run_all(queue)) == 2
    (job,) = claim(queue)
    assert job.run_id == ids["c"]
    assert job.deps == {
        str(ids[ref]): {"tool": "echo", "ref": ref, "status": "succeeded", "result": {"ok": True}}
        for ref in ("a", "b")
    }
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    alone = queue.enqueue(new_run(), now=T0).run_id
    (job,) = claim(queue)
    assert (job.run_id, job.deps) == (alone, None)


def test_retention__keeps_a_dependency_while_its_dependents_wait_and_empty_batches_go(
    queue, writer, engine
):
    _, result = batch(writer, [("a", []), ("b", ["a"])])
    run_all(queue)  # a succeeds; b is claimable and still queued
    later = T0 + timedelta(days=2)
    assert prune_expired(queue, retention_seconds=86400.0, batch=10, now=later) == 0
    run_all(queue)
    with engine.begin() as conn:
        conn.execute(text("UPDATE tool_runs SET finished_at = :t"), {"t": T0})
    assert prune_expired(queue, retention_seconds=86400.0, batch=10, now=later) == 2
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM tool_run_deps")) == 0
        left = conn.scalar(
            text("SELECT count(*) FROM batches WHERE id = :id"), {"id": result.batch_id}
        )
    assert left == 0


def test_claim__brings_the_dependencies_published_artifact_sets(queue, writer, engine):
    ids, _ = batch(writer, [("a", []), ("b", []), ("c", ["a", "b"])])
    run_all(queue)
    published = uuid.uuid4()
    with engine.begin() as conn:  # as a finalize that published a set would leave it
        conn.execute(
            text("UPDATE tool_runs SET artifact_set = :s WHERE id = :id"),
            {"s": published, "id": ids["a"]},
        )
    (job,) = claim(queue)
    assert job.dep_artifacts == {str(ids["a"]): published}
