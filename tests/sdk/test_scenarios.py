"""One set of scenarios, run with both flavours against both backends: the real API with a
worker, and the in-memory fake, which is so held to the real client's behaviour."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest

from runyard_client import (
    ArtifactIntegrityError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    RunStatus,
    StatusEvent,
    StdoutEvent,
    UnavailableError,
    WaitTimeoutError,
)
from tests.integration.api.test_api_builds import live_worker
from tests.sdk.conftest import Yard
from tests.sdk.harness import Canned
from tests.sdk.tools import BINARY, BINARY_SHA256

LATER = datetime.now(UTC) + timedelta(days=1)


def soon(seconds: float) -> datetime:
    """A ``run_at`` that passes while a wait is under way."""
    return datetime.now(UTC) + timedelta(seconds=seconds)


def reads_of(yard: Yard, path: str) -> list[httpx2.Request]:
    """The GETs of exactly ``path`` (not of the paths under it)."""
    return [r for r in yard.faults.seen("GET", path) if r.url.path == path]


def held(request: httpx2.Request) -> float:
    """The seconds a read asked the API to hold its answer (0: none)."""
    return float(request.url.params.get("wait", "0"))


def test_submit_get_wait__the_run_is_queued_then_ends_with_its_result(yard: Yard):
    run = yard.client.submit("echo", {"n": 1})
    assert run.tool == "echo"
    # The API reads the run back after its commit, when a live worker may already have
    # claimed (or even finished) it; the fake runs a queued run only at the next request.
    assert run.status is RunStatus.QUEUED or yard.kind == "live"
    assert yard.client.get(run.id).id == run.id
    done = yard.client.wait(run.id, timeout=30)
    assert done.status is RunStatus.SUCCEEDED and done.result == {"n": 1} and done.done


def test_run__long_polls_with_one_key_and_makes_one_run(yard: Yard):
    run = yard.client.run("echo", {"n": 2}, timeout=30)
    assert run.succeeded and run.result == {"n": 2}
    posts = yard.faults.seen("POST", "/v1/runs")
    assert {post.headers["idempotency-key"] for post in posts} != {None}
    assert len({post.headers["idempotency-key"] for post in posts}) == 1
    assert all(post.url.params.get("wait") for post in posts)
    assert [r.id for r in yard.client.list(tool="echo")] == [run.id]


def test_run__a_raising_tool_fails_the_run_with_its_message(yard: Yard):
    run = yard.client.run("fail", {"what": "the input"}, timeout=30)
    assert run.status is RunStatus.FAILED
    assert (run.error_code, run.error, run.exit_code) == ("tool_failed", "refused the input", 1)


def test_depends_on__a_run_waits_for_its_dependencies_and_fails_with_them(yard: Yard):
    first = yard.client.submit("echo", {"step": 1})
    then = yard.client.submit("echo", {"step": 2}, depends_on=[first.id])
    assert then.depends_on == (first.id,)
    assert yard.client.wait(then.id, timeout=30).succeeded
    failing = yard.client.submit("fail", {})
    blocked = yard.client.submit("echo", {}, depends_on=[failing.id])
    ended = yard.client.wait(blocked.id, timeout=30)
    assert (ended.status, ended.error_code) == (RunStatus.FAILED, "dependency_failed")


def test_list__walks_every_page_newest_first(yard: Yard):
    made = [yard.client.submit("echo", {"i": i}, run_at=LATER).id for i in range(5)]
    listed = [run.id for run in yard.client.list(page_size=2)]
    assert listed == made[::-1]
    pages = yard.faults.seen("GET", "/v1/runs")
    assert [p.url.params.get("limit") for p in pages] == ["2", "2", "2"]
    assert sum(1 for p in pages if p.url.params.get("cursor")) == 2
    assert [run.id for run in yard.client.list(page_size=2, limit=3)] == made[::-1][:3]
    assert list(yard.client.list(status="succeeded")) == []


def test_cancel__a_queued_run_is_cancelled_and_a_second_cancel_conflicts(yard: Yard):
    run = yard.client.submit("echo", {}, run_at=LATER)
    assert run.waiting_for == "its run_at time"
    assert yard.client.cancel(run.id).status is RunStatus.CANCELLED
    with pytest.raises(ConflictError) as caught:
        yard.client.cancel(run.id)
    assert (caught.value.status, caught.value.code) == (409, "run_finished")
    assert caught.value.problem["run_status"] == "cancelled"


def test_rerun__a_new_run_of_the_same_input_names_the_first(yard: Yard):
    first = yard.client.run("echo", {"x": "y"}, timeout=30)
    again = yard.client.rerun(first.id)
    assert again.id != first.id and again.rerun_of == first.id
    assert yard.client.wait(again.id, timeout=30).result == {"x": "y"}


def test_delete__a_finished_run_goes_an_unfinished_one_conflicts(yard: Yard):
    done = yard.client.run("echo", {}, timeout=30)
    yard.client.delete(done.id)
    with pytest.raises(NotFoundError) as caught:
        yard.client.get(done.id)
    assert (caught.value.status, caught.value.code) == (404, "run_not_found")
    queued = yard.client.submit("echo", {}, run_at=LATER)
    with pytest.raises(ConflictError) as conflict:
        yard.client.delete(queued.id)
    assert conflict.value.code == "run_not_finished"


def test_events__typed_in_order_and_resumable_after_an_id(yard: Yard):
    run = yard.client.run("chatty", {"lines": 3}, timeout=30)
    events = list(yard.client.events(run.id))
    assert isinstance(events[0], StatusEvent) and events[0].status is RunStatus.QUEUED
    assert isinstance(events[-1], StatusEvent) and events[-1].status is RunStatus.SUCCEEDED
    chunks = [e.text for e in events if isinstance(e, StdoutEvent)]
    assert "".join(chunks) == "line 0\nline 1\nline 2\n"
    assert {"claimed", "stderr"} <= {e.type for e in events}
    later = list(yard.client.events(run.id, after=events[2].id))
    assert [e.id for e in later] == [e.id for e in events[3:]]


def test_events__a_dropped_stream_resumes_with_last_event_id_and_loses_nothing(yard: Yard):
    run = yard.client.run("chatty", {"lines": 6}, timeout=30)
    whole = [e.id for e in yard.client.events(run.id)]
    yard.faults.cut_events_after = 2
    resumed = [e.id for e in yard.client.events(run.id)]
    assert resumed == whole
    streams = yard.faults.seen("GET", f"/v1/runs/{run.id}/events")[1:]
    assert len(streams) >= 3
    assert [s.headers.get("last-event-id") for s in streams[1:3]] == [str(whole[1]), str(whole[3])]


def test_logs__lines_now_and_followed_by_stream(yard: Yard):
    run = yard.client.run("chatty", {"lines": 2}, timeout=30)
    assert list(yard.client.logs(run.id)) == ["line 0", "line 1", "warning: chatty"]
    assert list(yard.client.logs(run.id, stream="stderr")) == ["warning: chatty"]
    followed = list(yard.client.logs(run.id, follow=True, stream="stdout"))
    assert followed == ["line 0", "line 1"]


def test_artifacts__listed_and_downloaded_with_their_sha256(yard: Yard, tmp_path: Path):
    run = yard.client.run("files", {}, timeout=30)
    listed = {a.path: a for a in yard.client.artifacts(run.id)}
    assert set(listed) == {"report.txt", "data/blob.bin"}
    assert listed["data/blob.bin"].sha256 == BINARY_SHA256
    one = yard.client.download(run.id, "data/blob.bin", tmp_path / "blob")
    assert one == tmp_path / "blob" and one.read_bytes() == BINARY
    tree = yard.client.download_all(run.id, tmp_path / "all")
    assert sorted(p.relative_to(tmp_path / "all").as_posix() for p in tree) == sorted(listed)
    assert (tmp_path / "all" / "report.txt").read_text() == "all good\n"
    with pytest.raises(NotFoundError):
        yard.client.download(run.id, "missing.txt", tmp_path / "missing")


def test_artifacts__a_corrupted_download_is_refused_and_leaves_nothing(yard: Yard, tmp_path: Path):
    run = yard.client.run("files", {}, timeout=30)
    (tmp_path / "blob").write_bytes(b"the old file")
    yard.faults.corrupt_artifacts = True
    with pytest.raises(ArtifactIntegrityError):
        yard.client.download(run.id, "data/blob.bin", tmp_path / "blob")
    assert (tmp_path / "blob").read_bytes() == b"the old file"
    assert [p.name for p in tmp_path.iterdir()] == ["blob"]


def test_batches__submit_wait_get_retry_cancel(yard: Yard):
    batch = yard.client.submit_batch(
        [
            {"ref": "build", "tool": "echo", "input": {"step": 1}},
            {"ref": "test", "tool": "fail", "input": {}, "depends_on": ["build"]},
        ]
    )
    assert set(batch.run_ids) == {"build", "test"} and batch.size == 2
    ended = yard.client.wait_batch(batch.id, timeout=30, poll_seconds=0.1)
    assert ended.status == "failed" and ended.counts == {"succeeded": 1, "failed": 1}
    runs = {run.ref: run for run in yard.client.get_batch(batch.id).runs}
    assert runs["test"].depends_on == ("build",) and runs["test"].error_code == "tool_failed"
    retried = yard.client.retry_batch(batch.id)
    assert set(retried.run_ids) == {"test"}
    assert yard.client.get(retried.run_ids["test"]).rerun_of == batch.run_ids["test"]
    later = yard.client.submit_batch([{"tool": "echo", "run_at": LATER}])
    assert yard.client.cancel_batch(later.id).status == "cancelled"
    assert [b.id for b in yard.client.list_batches()] == [later.id, batch.id]


def test_errors__typed_with_code_detail_and_field(yard: Yard):
    with pytest.raises(NotFoundError) as missing:
        yard.client.get(uuid.uuid4())
    assert missing.value.code == "run_not_found" and "no run" in missing.value.detail
    with pytest.raises(InvalidRequestError) as unknown:
        yard.client.submit("nope", {})
    assert (unknown.value.status, unknown.value.code, unknown.value.field) == (
        422,
        "unknown_tool",
        "tool",
    )
    yard.client.submit("echo", {"a": 1}, idempotency_key="order-1", run_at=LATER)
    with pytest.raises(ConflictError) as conflict:
        yard.client.submit("echo", {"a": 2}, idempotency_key="order-1", run_at=LATER)
    assert conflict.value.code == "idempotency_conflict"


def test_errors__a_full_tenant_is_rate_limited_with_retry_after(open_yard):
    yard = open_yard(max_queued=1)
    yard.client.submit("echo", {}, run_at=LATER)
    with pytest.raises(RateLimitedError) as caught:
        yard.client.submit("echo", {}, run_at=LATER)
    assert (caught.value.status, caught.value.code) == (429, "tenant_queued_limit")
    assert caught.value.retry_after == 2.0


@pytest.mark.slow  # sits out backoffs and long-poll timeouts
def test_retries__a_503_is_retried_for_reads_and_keyed_posts_only(yard: Yard):
    run = yard.client.submit("echo", {}, run_at=LATER)
    yard.faults.canned.append(
        Canned("GET", f"/v1/runs/{run.id}", 503, headers={"Retry-After": "0"})
    )
    assert yard.client.get(run.id).id == run.id
    assert len(yard.faults.seen("GET", f"/v1/runs/{run.id}")) == 2

    yard.faults.canned.append(Canned("POST", "/v1/runs", 503))
    with pytest.raises(UnavailableError) as refused:
        yard.client.submit("echo", {"unkeyed": True}, run_at=LATER)
    assert refused.value.status == 503
    assert sum(1 for p in yard.faults.seen("POST", "/v1/runs") if b'"unkeyed"' in p.content) == 1

    yard.faults.canned.append(Canned("POST", "/v1/runs", 0))  # no connection at all
    keyed = yard.client.submit("echo", {"keyed": True}, idempotency_key="k-1", run_at=LATER)
    assert sum(1 for p in yard.faults.seen("POST", "/v1/runs") if b'"keyed"' in p.content) == 2
    assert [r.id for r in yard.client.list() if r.input == {"keyed": True}] == [keyed.id]

    yard.faults.canned.append(Canned("POST", f"/v1/runs/{run.id}/cancel", 502))
    with pytest.raises(UnavailableError):
        yard.client.cancel(run.id)
    yard.faults.canned.append(Canned("GET", "/v1/tools", 503, times=10))
    with pytest.raises(UnavailableError):
        yard.client.tools()
    assert len(yard.faults.seen("GET", "/v1/tools")) == 4  # the first try and three retries


@pytest.mark.slow  # sits out backoffs and long-poll timeouts
def test_wait__gives_up_after_its_timeout_with_the_run_as_it_was(yard: Yard):
    run = yard.client.submit("echo", {}, run_at=LATER)
    with pytest.raises(WaitTimeoutError) as waited:
        yard.client.wait(run.id, timeout=0.5)
    assert waited.value.last.id == run.id and waited.value.last.status is RunStatus.QUEUED
    with pytest.raises(WaitTimeoutError):
        yard.client.run("echo", {}, run_at=LATER, timeout=1.5)


@pytest.mark.slow  # sits out a long poll
def test_wait__a_run_that_ends_during_a_long_poll_is_answered_by_it(yard: Yard):
    run = yard.client.submit("echo", {"n": 3}, run_at=soon(2))
    done = yard.client.wait(run.id, timeout=30)
    assert done.succeeded and done.result == {"n": 3}
    reads = reads_of(yard, f"/v1/runs/{run.id}")
    assert reads and all(0 < held(read) <= 30 for read in reads)
    # Held answers (the live API holds one second at most): a few reads, no polling loop.
    assert len(reads) <= 5
    assert yard.faults.seen("GET", f"/v1/runs/{run.id}/events") == []


@pytest.mark.slow  # sits out long-poll timeouts and a backoff
def test_wait__a_long_poll_that_fails_on_the_way_is_sent_again(yard: Yard):
    run = yard.client.submit("echo", {"n": 4}, run_at=soon(1))
    path = f"/v1/runs/{run.id}"
    yard.faults.canned.append(Canned("GET", path, 0))  # no connection at all
    yard.faults.canned.append(Canned("GET", path, 503, headers={"Retry-After": "0"}))
    assert yard.client.wait(run.id, timeout=30).result == {"n": 4}
    assert len(reads_of(yard, path)) >= 3


@pytest.mark.slow  # sits out long-poll timeouts and a backoff
def test_wait__long_polls_until_its_timeout_then_gives_up_with_the_last_answer(yard: Yard):
    run = yard.client.submit("echo", {}, run_at=LATER)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as waited:
        yard.client.wait(run.id, timeout=1.5)
    assert time.monotonic() - started >= 1.5
    assert waited.value.last.id == run.id and waited.value.last.status is RunStatus.QUEUED
    reads = reads_of(yard, f"/v1/runs/{run.id}")
    assert reads and all(held(read) <= 1.5 for read in reads) and held(reads[0]) > 0


@pytest.mark.slow  # sits out backoffs and long-poll timeouts
def test_wait_batch__ends_during_a_long_poll_or_times_out_with_the_batch_as_it_was(yard: Yard):
    batch = yard.client.submit_batch(
        [
            {"ref": "first", "tool": "echo", "input": {}, "run_at": soon(1.5)},
            {"ref": "then", "tool": "echo", "input": {}, "depends_on": ["first"]},
        ]
    )
    ended = yard.client.wait_batch(batch.id, timeout=30)
    assert ended.status == "succeeded" and ended.counts == {"succeeded": 2}
    reads = reads_of(yard, f"/v1/batches/{batch.id}")
    assert reads and all(held(read) > 0 for read in reads) and len(reads) <= 5

    later = yard.client.submit_batch([{"tool": "echo", "run_at": LATER}])
    with pytest.raises(WaitTimeoutError) as waited:
        yard.client.wait_batch(later.id, timeout=1.0)
    assert waited.value.last.id == later.id and waited.value.last.status == "queued"


def test_tools__lists_the_registered_tools(yard: Yard):
    assert {"echo", "fail", "chatty", "files"} <= {tool.name for tool in yard.client.tools()}


def test_list_page__one_page_at_a_time_with_the_cursor_to_the_next(yard: Yard):
    made = [yard.client.submit("echo", {"i": i}, run_at=LATER).id for i in range(3)]
    first = yard.client.list_page(limit=2)
    assert [run.id for run in first.items] == made[::-1][:2] and first.next_cursor
    rest = yard.client.list_page(limit=2, cursor=first.next_cursor)
    assert [run.id for run in rest.items] == made[:1] and rest.next_cursor is None
    assert yard.client.list_page(status="succeeded", tool="echo").items == ()


def test_artifact_list_and_log_text__as_the_api_has_them(yard: Yard):
    run = yard.client.run("files", {}, timeout=30)
    listing = yard.client.artifact_list(run.id)
    assert (listing.run_id, listing.count) == (str(run.id), 2)
    assert listing.total_bytes == sum(a.size for a in listing.artifacts) > len(BINARY)
    assert listing.tar_url == f"/v1/runs/{run.id}/artifacts.tar"
    assert list(listing.artifacts) == yard.client.artifacts(run.id)
    chatty = yard.client.run("chatty", {"lines": 2}, timeout=30)
    assert yard.client.log_text(chatty.id, stream="stdout") == "line 0\nline 1\n"
    assert yard.client.log_text(chatty.id).splitlines() == list(yard.client.logs(chatty.id))


def test_events_ndjson__the_whole_log_a_line_an_event_and_after_an_id(yard: Yard):
    run = yard.client.run("chatty", {"lines": 2}, timeout=30)
    skipped: list[object] = []
    typed = list(yard.client.events(run.id, on_skip=skipped.append))
    lines = list(yard.client.events_ndjson(run.id))
    parsed = [json.loads(line) for line in lines]
    assert [(e["id"], e["type"]) for e in parsed] == [(e.id, e.type) for e in typed]
    assert parsed[-1]["data"]["status"] == "succeeded" and skipped == []
    assert list(yard.client.events_ndjson(run.id, after=parsed[1]["id"])) == lines[2:]


@pytest.mark.parametrize("backend_kind", ["live"])  # the fake has no builds (its README)
def test_builds__an_admin_builds_a_tool_then_lists_and_reads_its_build(open_yard, engine):
    yard = open_yard(admin=True)
    live_worker(engine, "engine-sdk")  # the engine a build is queued on
    asked = yard.client.build_tool("built")
    assert (asked.tool, asked.queued) == ("built", 1)
    assert asked.tag.startswith("runyard-build/built:")
    [build] = yard.client.list_builds(tool="built")
    assert (build.tag, build.digest, build.engine_id) == (asked.tag, asked.digest, "engine-sdk")
    assert build.status == "queued" and build.log is None
    assert yard.client.list_builds(tool="built", status="ready") == []
    shown = yard.client.get_build(build.id)
    assert shown.id == build.id and shown.log_size == 0
    [tool] = [t for t in yard.client.tools() if t.name == "built"]
    assert tool.build is not None and tool.build.engines == {"engine-sdk": "queued"}
    assert yard.client.build_tool("built", force=True).queued == 0  # queued already
    with pytest.raises(NotFoundError) as missing:
        yard.client.get_build(uuid.uuid4())
    assert missing.value.code == "build_not_found"
    with pytest.raises(InvalidRequestError) as unbuilt:
        yard.client.build_tool("echo")
    assert unbuilt.value.code == "not_built"


@pytest.mark.parametrize("backend_kind", ["live"])  # the fake has no webhooks (its README)
def test_tenant_webhook__set_shows_the_secret_once_get_never(open_yard):
    yard = open_yard(admin=True)
    made = yard.client.set_tenant_webhook("acme", None)
    assert made.tenant == "acme" and made.url is None and made.has_secret
    assert made.secret is not None and made.secret.startswith("whsec_")
    assert yard.client.set_tenant_webhook("acme", None).secret is None
    rotated = yard.client.set_tenant_webhook("acme", None, rotate_secret=True).secret
    assert rotated is not None and rotated != made.secret
    shown = yard.client.get_tenant_webhook("acme")
    assert (shown.has_secret, shown.secret) == (True, None)
    assert (shown.events, shown.deadline_lead_seconds) == (["run.completed"], 60)
    chosen = yard.client.set_tenant_webhook(
        "acme", None, events=["run.started", "run.completed"], deadline_lead_seconds=30
    )
    assert (chosen.events, chosen.deadline_lead_seconds) == (["run.started", "run.completed"], 30)
    with pytest.raises(InvalidRequestError):
        yard.client.set_tenant_webhook("acme", None, events=["run.exploded"])
    with pytest.raises(InvalidRequestError):
        yard.client.set_tenant_webhook("acme", "not a url")
