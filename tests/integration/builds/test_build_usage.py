"""RECORD_BUILD_USAGE and builds in the usage report: once per build and round, under the
build's lease, charged to the tenant of the oldest run waiting for it, seen by no other."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, text

from runyard.domain.usage import BuildUsage, GroupBy, report_window
from runyard.queue import JobQueue
from runyard.queue.builds import BuildQueue, ClaimedBuild
from runyard.usage.ledger import Recorded, UsageLedger
from tests.integration.builds.test_build_sql import LEASE, T0, TAG, A, built_run, claim_runs, ref

USED = BuildUsage(cpu_seconds=3.0, memory_peak_bytes=2048)
WINDOW = report_window(T0.date(), T0.date(), today=T0.date())


def requested(builds: BuildQueue, jobs: JobQueue, *tenants: str) -> ClaimedBuild:
    """The build of TAG, claimed, with a run of each tenant waiting for it (in that order)."""
    builds.save_context(ref(), b"tar")
    for n, tenant in enumerate(tenants):
        jobs.enqueue(built_run(tenant=tenant), now=T0 + timedelta(seconds=n))
    builds.request_builds(A, ["default"], now=T0)
    held = builds.claim(worker_id="w1", engine_id=A, lease_seconds=LEASE, now=T0)
    assert held is not None
    return held


def usage_rows(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT tenant, wall_seconds, cpu_seconds, memory_peak_bytes FROM build_usage "
                "ORDER BY recorded_at"
            )
        )
        return [tuple(row) for row in rows]


def test_record_build_usage__once_per_build_whoever_records_it(engine: Engine):
    builds, jobs, ledger = BuildQueue(engine), JobQueue(engine), UsageLedger(engine)
    first = requested(builds, jobs, "acme", "other")
    # Its worker died mid-build; another takes it over once the lease ran out.
    late = T0 + timedelta(seconds=LEASE + 1)
    second = builds.claim(worker_id="w2", engine_id=A, lease_seconds=LEASE, now=late)
    assert second is not None and second.recovered
    at = T0 + timedelta(seconds=40)
    assert ledger.record_build(first.build_id, first.lease_token, USED, now=at) is (
        Recorded.LEASE_LOST
    )
    assert ledger.record_build(second.build_id, second.lease_token, USED, now=at) is (
        Recorded.RECORDED
    )
    again = BuildUsage(cpu_seconds=9.0)
    assert ledger.record_build(second.build_id, second.lease_token, again, now=at) is (
        Recorded.ALREADY
    )
    # Charged to the oldest waiting run's tenant; its wall time from the first claim.
    assert usage_rows(engine) == [("acme", 40.0, 3.0, 2048)]
    # Builds are not attempts of a tenant's runs: the counters and the daily quota skip them.
    assert ledger.totals() == [] and ledger.cpu_seconds_today("acme", now=at) == 0


def test_record_build_usage__a_rebuild_is_a_round_of_its_own_and_no_waiting_run_is_the_platforms(
    engine: Engine,
):
    builds, jobs, ledger = BuildQueue(engine), JobQueue(engine), UsageLedger(engine)
    held = requested(builds, jobs, "acme")
    assert ledger.record_build(held.build_id, held.lease_token, BuildUsage(), now=T0)
    assert builds.ready(held.build_id, held.lease_token, "sha256:one", now=T0)
    assert len(claim_runs(jobs)) == 1  # the run no longer waits
    later = T0 + timedelta(minutes=5)
    assert builds.rebuild(TAG, "default", force=True, now=later).again == 1
    rebuilt = builds.claim(worker_id="w1", engine_id=A, lease_seconds=LEASE, now=later)
    assert rebuilt is not None and rebuilt.build_id == held.build_id
    done = later + timedelta(seconds=2)
    assert ledger.record_build(rebuilt.build_id, rebuilt.lease_token, USED, now=done) is (
        Recorded.RECORDED
    )
    assert usage_rows(engine) == [("acme", 0.0, None, None), (None, 2.0, 3.0, 2048)]


def test_report__builds_are_lines_of_their_own_kind_seen_by_their_tenant_only(engine: Engine):
    builds, jobs, ledger = BuildQueue(engine), JobQueue(engine), UsageLedger(engine)
    held = requested(builds, jobs, "acme")
    assert ledger.record_build(held.build_id, held.lease_token, USED, now=T0)
    [line] = ledger.report(WINDOW, GroupBy.TOOL, "acme")
    assert (line.kind, line.key, line.runs, line.attempts, line.cpu_seconds) == (
        "build",
        "stats",
        0,
        1,
        3.0,
    )
    assert ledger.report(WINDOW, GroupBy.TOOL, "other") == []
    [everyone] = ledger.report(WINDOW, GroupBy.TENANT, None)
    assert (everyone.kind, everyone.key, everyone.memory_peak_bytes) == ("build", "acme", 2048)


def test_wait_of__from_the_runs_submit_until_its_build_was_ready_on_that_engine(engine: Engine):
    builds, jobs = BuildQueue(engine), JobQueue(engine)
    builds.save_context(ref(), b"tar")
    run_id = jobs.enqueue(built_run(), now=T0).run_id
    builds.request_builds(A, ["default"], now=T0)
    held = builds.claim(worker_id="w1", engine_id=A, lease_seconds=LEASE, now=T0)
    assert held is not None
    assert builds.wait_of(run_id, TAG, A) is None  # not ready yet
    ready_at = T0 + timedelta(seconds=7)
    span = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert builds.ready(held.build_id, held.lease_token, "sha256:x", traceparent=span, now=ready_at)
    wait = builds.wait_of(run_id, TAG, A)
    assert wait is not None and (wait.ready_at, wait.traceparent) == (ready_at, span)
    assert builds.wait_of(run_id, TAG, "engine-b") is None
