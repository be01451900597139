"""The SDK's pure rules, shared by both flavours: retries, errors, paging, event follows,
log lines, verified downloads, request bodies."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest

from runyard_client import (
    ArtifactIntegrityError,
    AsyncRunyard,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    OtherEvent,
    RateLimitedError,
    Runyard,
    ServerError,
    StatusEvent,
    StdoutEvent,
    UnavailableError,
    UnsafePathError,
    WaitTimeoutError,
)
from runyard_client._calls import Call, Pager, get_batch, get_run, submit_body, waited
from runyard_client._config import ClientConfig
from runyard_client._files import VerifiedFile, target_path
from runyard_client._flow import Deadline, EventFollow, LineSplitter, LongPoll
from runyard_client._retry import RetryPolicy, is_safe
from runyard_client.errors import connection_error, error_from_response, parse_retry_after
from runyard_client.events import event_of
from runyard_client.models import Artifact, RunPage

POLICY = RetryPolicy(max_retries=2, base_seconds=1.0, max_seconds=4.0)
PROBLEM = b'{"status": %d, "code": "some_code", "detail": "it went wrong", "field": "tool"}'


def unavailable(status: int | None, retry_after: float | None = None) -> UnavailableError:
    return UnavailableError("down", status=status, retry_after=retry_after)


@pytest.mark.parametrize(
    ("retry", "error", "safe", "pause"),
    [
        (0, unavailable(503), True, 0.5),  # half the step, plus rand() (0 here) of the rest
        (1, unavailable(None), True, 1.0),
        (1, unavailable(502, retry_after=3.0), True, 3.0),  # Retry-After wins when longer
        (0, unavailable(504, retry_after=60.0), True, 4.0),  # ... up to max_seconds
        (2, unavailable(503), True, None),  # out of retries
        (0, unavailable(503), False, None),  # an unsafe request is never sent twice
        (0, RateLimitedError("full", status=429, retry_after=2.0), True, None),
        (0, ServerError("bug", status=500), True, None),
        (0, NotFoundError("gone", status=404), True, None),
    ],
)
def test_retry_delay__table(retry, error, safe, pause):
    assert POLICY.delay(retry, error, safe=safe, rand=lambda: 0.0) == pause


def test_retry_backoff__is_capped_and_jittered_within_its_step():
    assert [POLICY.backoff(n, rand=lambda: 1.0) for n in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert [POLICY.backoff(n, rand=lambda: 0.0) for n in range(3)] == [0.5, 1.0, 2.0]


@pytest.mark.parametrize(
    ("method", "headers", "safe"),
    [
        ("GET", {}, True),
        ("DELETE", {}, True),
        ("POST", {}, False),
        ("POST", {"Idempotency-Key": "k"}, True),
        ("post", {"idempotency-key": "k"}, True),
        ("PUT", {}, False),
    ],
)
def test_is_safe__table(method, headers, safe):
    assert is_safe(method, headers) is safe


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2", 2.0),
        (" 30 ", 30.0),
        ("Thu, 01 Jan 1970 00:01:40 GMT", 60.0),  # 100 s after the epoch, now = 40 s
        ("Thu, 01 Jan 1970 00:00:10 GMT", 0.0),  # in the past: at once
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_retry_after__table(value, seconds):
    assert parse_retry_after(value, now=40.0) == seconds


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, InvalidRequestError),
        (404, NotFoundError),
        (409, ConflictError),
        (422, InvalidRequestError),
        (429, RateLimitedError),
        (500, ServerError),
        (502, UnavailableError),
        (503, UnavailableError),
    ],
)
def test_error_from_response__the_class_by_status_with_the_problem(status, kind):
    error = error_from_response(status, {"Retry-After": "3"}, PROBLEM % status)
    assert type(error) is kind
    assert (error.status, error.code, error.detail, error.field) == (
        status,
        "some_code",
        "it went wrong",
        "tool",
    )
    assert error.retry_after == 3.0 and str(error) == f"{status} some_code: it went wrong"


def test_error_from_response__a_proxy_page_without_a_problem_still_reads():
    error = error_from_response(502, {}, b"<html>Bad Gateway</html>")
    assert isinstance(error, UnavailableError)
    assert (error.code, error.detail, error.retry_after) == (
        "http_502",
        "<html>Bad Gateway</html>",
        None,
    )


def test_connection_error__has_no_status_and_is_retried():
    error = connection_error(OSError("refused"))
    assert error.status is None and POLICY.delay(0, error, safe=True, rand=lambda: 0) == 0.5


def page(ids: list[str], cursor: str | None) -> RunPage:
    run: dict[str, object] = {
        "tool": "echo",
        "status": "queued",
        "mode": "queue",
        "input": {},
        "result": None,
        "exit_code": None,
        "attempts": 0,
        "max_attempts": 1,
        "error_code": None,
        "error": None,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "requested_at": "2026-01-01T00:00:00Z",
        "started_at": None,
        "finished_at": None,
    }
    items = [{**run, "id": str(uuid.UUID(int=int(i)))} for i in ids]
    return RunPage.model_validate({"items": items, "next_cursor": cursor})


def test_pager__follows_cursors_to_the_end():
    pager: Pager[RunPage, object] = Pager(
        "/v1/runs", lambda r: page([], None), {"tool": None}, 2, None
    )
    first = pager.next_call()
    assert first is not None and dict(first.params) == {"limit": 2}
    assert len(pager.take(page(["1", "2"], "abc"))) == 2
    second = pager.next_call()
    assert second is not None and dict(second.params) == {"limit": 2, "cursor": "abc"}
    assert len(pager.take(page(["3"], None))) == 1
    assert pager.next_call() is None


def test_pager__a_limit_shrinks_the_last_page_and_stops():
    pager: Pager[RunPage, object] = Pager("/v1/runs", lambda r: page([], None), {}, 2, 3)
    pager.take(page(["1", "2"], "abc"))
    last = pager.next_call()
    assert last is not None and dict(last.params)["limit"] == 1
    assert len(pager.take(page(["3", "4"], "def"))) == 1
    assert pager.next_call() is None


def test_submit_body__sends_only_what_was_given():
    at = datetime(2030, 1, 2, tzinfo=UTC)
    dep = uuid.UUID(int=5)
    assert submit_body("echo", {"a": 1}) == {"tool": "echo", "input": {"a": 1}}
    assert submit_body(
        "echo", None, depends_on=[dep], run_at=at, priority=3, limits={"cpus": 0.5}
    ) == {
        "tool": "echo",
        "input": None,
        "priority": 3,
        "limits": {"cpus": 0.5},
        "depends_on": [str(dep)],
        "run_at": "2030-01-02T00:00:00+00:00",
    }


AT = "2026-01-01T00:00:00+00:00"
# What a log chunk carries besides its text.
CHUNK = {"at": AT, "attempt": 1, "until": "2026-01-01T00:00:00.000000000Z"}


def test_event_of__known_types_are_typed_and_unknown_ones_kept():
    status = event_of(7, "status", {"at": AT, "status": "failed", "exit_code": 3})
    assert isinstance(status, StatusEvent) and status.status.is_terminal and status.exit_code == 3
    chunk = event_of(8, "stdout", {"at": AT, "text": "hi\n", "attempt": 1, "until": "t"})
    assert isinstance(chunk, StdoutEvent) and chunk.text == "hi\n"
    other = event_of(9, "sparkle", {"at": AT, "brightness": 60})
    assert isinstance(other, OtherEvent) and (other.type, other.data) == (
        "sparkle",
        {"brightness": 60},
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_event_follow__resumes_after_the_last_id_received_and_ends_at_the_final_status():
    follow = EventFollow(uuid.UUID(int=1), 5, POLICY)
    assert follow.headers()["Last-Event-ID"] == "5"
    follow.connected(200)
    assert follow.receive("", "", "", 2000) is None  # the retry: hint
    follow.receive("9", "status", json.dumps({"at": AT, "status": "running"}), None)
    follow.receive("8", "stdout", json.dumps({**CHUNK, "text": "x"}), None)
    assert follow.headers()["Last-Event-ID"] == "8"  # the last, not the largest
    assert follow.failed(unavailable(None)) == 0.0  # it dropped after progress: at once
    assert follow.failed(unavailable(None)) == 2.0  # again without progress: the server's pause
    follow.receive("10", "status", json.dumps({"at": AT, "status": "succeeded"}), None)
    assert follow.done


def test_event_follow__gives_up_on_errors_that_will_not_pass_or_keep_coming():
    follow = EventFollow(uuid.UUID(int=1), None, POLICY)
    assert "Last-Event-ID" not in follow.headers()
    with pytest.raises(NotFoundError):
        follow.failed(NotFoundError("gone", status=404))
    follow.failed(unavailable(503))
    follow.failed(unavailable(503))
    with pytest.raises(UnavailableError):
        follow.failed(unavailable(503))


def test_event_follow__a_204_or_the_deadline_ends_it():
    ended = EventFollow(uuid.UUID(int=1), 3, POLICY)
    ended.connected(204)
    assert ended.done
    clock = Clock()
    timed = EventFollow(uuid.UUID(int=1), None, POLICY, Deadline(5.0, clock))
    assert timed.read_seconds() == 5.0
    clock.now += 6
    assert timed.failed(unavailable(None)) == 0.0 and timed.done


def test_deadline__bounds_and_expires():
    clock = Clock()
    deadline = Deadline(10.0, clock)
    assert (deadline.bound(30.0), deadline.bound(4.0)) == (10.0, 4.0)
    clock.now += 11
    assert deadline.expired() and deadline.remaining() == 0.0
    assert not Deadline(None, clock).expired()


def long_poll(clock: Clock, timeout: float | None) -> LongPoll[str]:
    """A long-poll of answers that are strings, over until one says ``done``."""
    return LongPoll(
        lambda wait: Call("GET", "/v1/things/1", lambda r: r.text, params=waited(wait)),
        lambda answer: answer == "done",
        "thing 1",
        POLICY,
        Deadline(timeout, clock),
        clock=clock,
    )


def asked(call: Call[str] | None) -> float:
    assert call is not None
    return float(call.params.get("wait", 0))


def test_long_poll__slices_of_at_most_30_s_until_the_end():
    clock = Clock()
    poll = long_poll(clock, 70.0)
    assert asked(poll.next_call()) == 30.0
    clock.now += 30
    assert poll.answered("queued") == 0.0  # held the whole slice: ask again at once
    assert asked(poll.next_call()) == 30.0
    clock.now += 30
    poll.answered("running")
    assert asked(poll.next_call()) == 10.0  # what is left
    clock.now += 2
    assert poll.answered("done") == 0.0
    assert poll.next_call() is None and poll.result() == "done"


def test_long_poll__an_early_answer_waits_out_the_least_gap_within_the_deadline():
    clock = Clock()
    poll = long_poll(clock, 10.0)
    poll.next_call()
    clock.now += 0.25  # an API that did not hold the answer
    assert poll.answered("queued") == 0.75
    clock.now += 9.5
    poll.next_call()
    assert poll.answered("queued") == 0.25  # no pause past the deadline
    clock.now += 0.25
    assert asked(poll.next_call()) == 0.0  # a last plain read
    assert poll.answered("queued") == 0.0 and poll.next_call() is None
    with pytest.raises(WaitTimeoutError) as caught:
        poll.result()
    assert caught.value.last == "queued" and "thing 1" in str(caught.value)


def test_long_poll__no_time_at_all_is_one_plain_read():
    poll = long_poll(Clock(), 0.0)
    call = poll.next_call()
    assert call is not None and "wait" not in call.params
    poll.answered("queued")
    assert poll.next_call() is None
    with pytest.raises(WaitTimeoutError):
        poll.result()


def test_long_poll__transient_failures_are_retried_until_they_repeat_or_the_deadline():
    clock = Clock()
    poll = long_poll(clock, 100.0)
    poll.next_call()
    assert poll.failed(unavailable(503)) > 0
    assert poll.failed(unavailable(None)) > 0
    poll.answered("queued")  # progress: the failures count from zero again
    poll.failed(unavailable(502))
    poll.failed(unavailable(502))
    with pytest.raises(UnavailableError):
        poll.failed(unavailable(502))
    with pytest.raises(NotFoundError):
        long_poll(clock, 100.0).failed(NotFoundError("gone", status=404))
    clock.now += 101
    assert poll.failed(unavailable(503)) == 0.0 and poll.next_call() is None
    with pytest.raises(WaitTimeoutError):
        poll.result()


def test_long_poll_calls__ask_the_api_to_hold_and_read_that_much_longer():
    run = get_run(uuid.UUID(int=1), 12.3456)
    assert (run.path, dict(run.params), run.held_seconds) == (
        f"/v1/runs/{uuid.UUID(int=1)}",
        {"wait": 12.346},
        12.3456,
    )
    assert get_batch("b", 0).params == {} and get_batch("b", 0).held_seconds == 0
    config = ClientConfig(timeout=5.0)
    assert config.call_timeout(run).read == 5.0 + 12.3456
    assert config.call_timeout(get_batch("b")).read == 5.0


def test_line_splitter__whole_lines_per_stream_and_the_rest_at_the_end():
    splitter = LineSplitter("both")
    out = event_of(1, "stdout", {**CHUNK, "text": "a\nb"})
    err = event_of(2, "stderr", {**CHUNK, "text": "e"})
    more = event_of(3, "stdout", {**CHUNK, "text": "c\n"})
    assert splitter.feed(out) == ["a"]
    assert splitter.feed(err) == []
    assert splitter.feed(more) == ["bc"]
    assert splitter.close() == ["e"]
    assert LineSplitter("stderr").feed(out) == []


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../up", "a/../../b", "a//b", "./a", "a/.", "nul\0byte"]
)
def test_target_path__refuses_what_would_leave_the_directory(path: str, tmp_path: Path):
    with pytest.raises(UnsafePathError):
        target_path(tmp_path, path)


def test_target_path__keeps_subdirectories(tmp_path: Path):
    assert target_path(tmp_path, "a/b/c.txt") == tmp_path / "a" / "b" / "c.txt"


def artifact(data: bytes) -> Artifact:
    sha = hashlib.sha256(data).hexdigest()
    return Artifact(path="f.bin", size=len(data), sha256=sha, url="/x")


def test_verified_file__renames_only_a_matching_file_and_resumes_a_range(tmp_path: Path):
    data = b"0123456789"
    file = VerifiedFile(tmp_path / "f.bin", artifact(data))
    file.begin(200, {})
    file.write(data[:4])
    assert file.request_headers() == {"Range": "bytes=4-"}
    file.begin(206, {"content-range": "bytes 4-9/10"})
    file.write(data[4:])
    assert file.finish().read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_verified_file__a_whole_answer_after_a_drop_starts_over(tmp_path: Path):
    data = b"abcdef"
    file = VerifiedFile(tmp_path / "f.bin", artifact(data))
    file.write(b"abc")
    file.begin(200, {})
    file.write(data)
    assert file.finish().read_bytes() == data


@pytest.mark.parametrize(
    "steps",
    [
        [(200, {}, b"abcdeX")],  # wrong bytes
        [(200, {}, b"abc")],  # too short
        [(200, {}, b"abcdefg")],  # too long
        [(200, {}, b"abc"), (206, {"content-range": "bytes 2-5/6"}, b"cdef")],  # wrong range
    ],
)
def test_verified_file__a_mismatch_is_refused_and_nothing_is_left(steps, tmp_path: Path):
    file = VerifiedFile(tmp_path / "f.bin", artifact(b"abcdef"))
    with pytest.raises(ArtifactIntegrityError):
        for status, headers, body in steps:
            file.begin(status, headers)
            file.write(body)
        file.finish()
    file.discard()
    assert list(tmp_path.iterdir()) == []


def test_from_env__reads_the_url_and_the_key_in_both_flavours(monkeypatch: pytest.MonkeyPatch):
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=[])

    monkeypatch.setenv("RUNYARD_URL", "http://yard.test:9000/base/")
    monkeypatch.setenv("RUNYARD_API_KEY", "ry_secret")
    with Runyard.from_env(transport=httpx2.MockTransport(answer)) as client:
        assert client.tools() == []

    async def tools() -> None:
        async with AsyncRunyard.from_env(transport=httpx2.MockTransport(answer)) as client:
            assert await client.tools() == []

    asyncio.run(tools())
    assert [str(r.url) for r in seen] == ["http://yard.test:9000/base/v1/tools"] * 2
    assert {r.headers["authorization"] for r in seen} == {"Bearer ry_secret"}
    monkeypatch.delenv("RUNYARD_URL")
    monkeypatch.delenv("RUNYARD_API_KEY")
    with Runyard.from_env(transport=httpx2.MockTransport(answer)) as client:
        client.tools()
    assert str(seen[-1].url) == "http://127.0.0.1:8000/v1/tools"
    assert "authorization" not in seen[-1].headers
