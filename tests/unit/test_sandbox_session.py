"""The exec session's protocol with the fake engine's peer: each answer checked against its
request's nonce, anything out of place breaks the session, and the channel then makes the
call with one engine exec, so no byte is lost or taken twice."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from runyard.runner import AttemptControl
from runyard.runners.docker.sandbox_session import FrameSplitter
from runyard.sandbox_engine import ExecFiles
from runyard.sandbox_session import (
    MAX_LINE,
    SLACK_BYTES,
    SessionBroken,
    SessionClient,
    decode_word,
    encode_word,
)
from runyard.sandboxes.body import watch_start
from runyard.sandboxes.channel import REOPEN_SECONDS, ExecChannel
from runyard.sandboxes.fake import FakeExec, FakeSandboxEngine, pending_exec

CONTAINER = "runyard-test-1"


def engine_with_output(
    data: bytes, exit_code: int | None = 0
) -> tuple[FakeSandboxEngine, uuid.UUID]:
    fake = FakeSandboxEngine()
    exec_id = uuid.uuid4()
    fake.execs[exec_id] = FakeExec(["x"], {}, "/", b"", bytearray(data), exit_code=exit_code)
    return fake, exec_id


@pytest.mark.parametrize(
    "value",
    ["", "plain", "a b", "line\nbreak", "back\\slash \\0101", "*?[glob]", "é ünï", "'\"$`;|&"],
)
def test_encode_word__is_one_plain_word_that_decodes_to_the_value(value: str):
    word = encode_word(value)
    assert word.startswith("w")
    assert not any(c.isspace() or c in "*?[$`'\"" for c in word)
    assert decode_word(word) == value


def test_session__starts_polls_reads_and_kills_through_answers():
    fake, exec_id = engine_with_output(b"hello world", exit_code=None)
    session = fake.open_session(CONTAINER, lambda: None)
    new_id = uuid.uuid4()

    session.start(new_id, ["sh", "-c", "echo $A"], env={"A": "1 2"}, cwd="src dir")
    assert fake.execs[new_id].command == ["sh", "-c", "echo $A"]
    assert (fake.execs[new_id].env, fake.execs[new_id].cwd) == ({"A": "1 2"}, "src dir")
    assert session.poll(exec_id) == ExecFiles(True, None, 11, 0)
    assert session.poll(uuid.uuid4()) == ExecFiles(started=False)
    assert session.read(exec_id, "stdout", 6, 100) == b"world"
    session.kill(exec_id)
    assert fake.kills == [exec_id]
    assert fake.sessions[0].requests == ["s", "p", "p", "r", "k"]


def test_session__a_frame_nobody_asked_for_breaks_it():
    fake, exec_id = engine_with_output(b"data")
    session = fake.open_session(CONTAINER, lambda: None)
    # A command posing as the session, with a nonce it cannot know.
    fake.sessions[0].injected = b"0123456789abcdef p 0 999 999\n"

    with pytest.raises(SessionBroken):
        session.poll(exec_id)
    assert fake.sessions[0].closed
    with pytest.raises(SessionBroken):
        session.poll(exec_id)  # broken for good


def test_session__a_read_announcing_more_than_asked_breaks_it():
    fake, exec_id = engine_with_output(b"data")
    session = fake.open_session(CONTAINER, lambda: None)
    peer = fake.sessions[0]
    real_send = peer.send

    def announce_more(data: bytes) -> None:
        nonce = data.split(b" ")[1]
        assert peer.client is not None
        peer.client.feed_stdout(nonce + b" r 5\nhello" + nonce + b" e\n")

    peer.send = announce_more  # type: ignore[method-assign]
    with pytest.raises(SessionBroken, match="announced"):
        session.read(exec_id, "stdout", 0, 4)
    peer.send = real_send  # type: ignore[method-assign]


def test_session__a_flood_on_its_stdout_is_never_buffered_whole():
    fake, exec_id = engine_with_output(b"")
    session = fake.open_session(CONTAINER, lambda: None)
    assert isinstance(session, SessionClient)
    for _ in range(100):
        session.feed_stdout(b"x" * (MAX_LINE + SLACK_BYTES))
    assert session.closed
    with pytest.raises(SessionBroken):
        session.poll(exec_id)


def test_session__no_answer_in_time_breaks_it():
    fake, exec_id = engine_with_output(b"")
    session = fake.open_session(CONTAINER, lambda: None)
    fake.sessions[0].send = lambda data: None  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(SessionBroken, match="no answer line"):
        session.poll(exec_id)
    assert time.monotonic() - started < 5


def test_session__a_line_on_its_stderr_wakes_the_owner():
    fake = FakeSandboxEngine()
    woken = threading.Event()
    session = fake.open_session(CONTAINER, woken.set)
    assert isinstance(session, SessionClient)
    session.feed_stderr(b"x 1234")
    assert not woken.is_set()
    session.feed_stderr(b"\n")
    assert woken.is_set()


def test_channel__a_session_dying_mid_read_falls_back_to_the_same_bytes():
    data = bytes(range(256)) * 40
    fake, exec_id = engine_with_output(data)
    now = [0.0]
    channel = ExecChannel(fake, CONTAINER, clock=lambda: now[0])
    channel.ensure_open()
    fake.sessions[0].die_after_bytes = 100

    assert channel.read(exec_id, "stdout", 1000, 5000) == data[1000:6000]
    assert (channel.open, channel.broken) == (False, 1)
    channel.ensure_open()  # too soon: still one exec per call
    assert channel.read(exec_id, "stdout", 6000, 10) == data[6000:6010]
    assert len(fake.sessions) == 1
    now[0] += REOPEN_SECONDS
    channel.ensure_open()
    assert channel.open
    assert channel.read(exec_id, "stdout", 6010, 10) == data[6010:6020]
    assert fake.sessions[1].requests == ["r"]


def test_channel__a_broken_start_is_made_again_once_without_rewriting_stdin():
    fake = FakeSandboxEngine()
    channel = ExecChannel(fake, CONTAINER)
    channel.ensure_open()
    fake.sessions[0].injected = b"garbage\n"
    exec_id = uuid.uuid4()

    channel.start(pending_exec(exec_id, ["cat"], {"K": "v"}, "/w"), b"input", "65534:65534")

    # The session started it, the fallback's start found it started (the wrapper's mkdir).
    assert fake.execs[exec_id].stdin == b"input"
    assert fake.start_calls == 2
    assert len(fake.execs) == 1


def test_channel__without_a_session_every_call_is_an_engine_exec():
    fake, exec_id = engine_with_output(b"abc")
    fake.refuse_sessions = True
    channel = ExecChannel(fake, CONTAINER)
    channel.ensure_open()
    assert not channel.open
    assert channel.poll(exec_id) == ExecFiles(True, 0, 3, 0)
    assert channel.read(exec_id, "stdout", 1, 5) == b"bc"
    assert fake.sessions == []


def test_frame_splitter__cuts_stdout_and_stderr_apart_across_any_chunking():
    stream = (
        b"\x01\x00\x00\x00\x00\x00\x00\x05hello"
        + b"\x02\x00\x00\x00\x00\x00\x00\x02x\n"
        + b"\x01\x00\x00\x00\x00\x00\x00\x03 \x01\x02"
    )
    for size in (1, 3, 8, len(stream)):
        out, err = bytearray(), bytearray()
        splitter = FrameSplitter(out.extend, err.extend)
        for at in range(0, len(stream), size):
            splitter.feed(stream[at : at + size])
        assert (bytes(out), bytes(err)) == (b"hello \x01\x02", b"x\n")


def test_watch_start__the_second_ownership_check_marks_the_start_and_wakes_the_round():
    control = AttemptControl(still_owner=lambda: False)
    woken = threading.Event()
    starting = watch_start(control, woken)

    assert control.still_owner() is False  # the owner's answer, passed through
    assert not starting.is_set() and not woken.is_set()  # before the create
    control.still_owner()  # before the start
    assert starting.is_set() and woken.is_set()
