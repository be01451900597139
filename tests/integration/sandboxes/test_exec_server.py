"""Serving commands on Postgres with the fake engine: each byte stored once whoever sends
it, characters and secrets never split, a command started once and ended once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from runyard.queue import AdmissionCaps, ApiQueue
from runyard.registry.redact import Redactor
from runyard.registry.tools import ToolRegistry
from runyard.sandboxes.create import Sandboxes, SandboxRequest
from runyard.sandboxes.fake import FakeSandboxEngine
from runyard.sandboxes.serve import ExecServer
from runyard.sandboxes.store import ExecRow, NewExec, SandboxStore
from runyard.sandboxes.wakeups import ExecWakeups

CONTAINER = "runyard-test-1"


def new_sandbox(engine: Engine, registry: ToolRegistry) -> uuid.UUID:
    store = SandboxStore(engine)
    uses = Sandboxes(ApiQueue(engine), registry, AdmissionCaps(), store, output_cap=64)
    return uses.create(SandboxRequest(tenant="acme", tool="sandbox"))


@pytest.fixture
def servers() -> Iterator[list[ExecServer]]:
    """Servers a test makes, closed after it (their threads stopped)."""
    made: list[ExecServer] = []
    yield made
    for made_server in made:
        made_server.close()


def server(
    store: SandboxStore,
    fake: FakeSandboxEngine,
    run_id: uuid.UUID,
    cap: int = 1_000,
    start_grace_seconds: float = 10.0,
) -> ExecServer:
    return ExecServer(
        fake,
        store,
        run_id,
        CONTAINER,
        user="65534:65534",
        output_cap=cap,
        redactor=lambda: Redactor(fake.secret_values(CONTAINER, [])),
        start_grace_seconds=start_grace_seconds,
    )


def sandbox_with_command(
    engine: Engine, registry: ToolRegistry, command: list[str]
) -> tuple[SandboxStore, FakeSandboxEngine, uuid.UUID, uuid.UUID]:
    """A sandbox on a fake engine with one pending command."""
    store = SandboxStore(engine)
    run_id = new_sandbox(engine, registry)
    exec_id = store.insert_exec(run_id, NewExec(command, b"", {}, "/", 60))
    assert exec_id is not None
    return store, FakeSandboxEngine(), run_id, exec_id


def stored_text(store: SandboxStore, exec_id: uuid.UUID, stream: str = "stdout") -> bytes:
    chunks = store.chunks_from(exec_id, 0, 0, 10_000)
    return b"".join(c.data for c in chunks if c.stream == stream)


def exec_row(store: SandboxStore, run_id: uuid.UUID, exec_id: uuid.UUID) -> ExecRow:
    found = store.exec_view(run_id, exec_id, None)
    assert found is not None
    return found


def test_append_chunk__stores_only_where_the_stored_bytes_end(
    engine: Engine, registry: ToolRegistry
):
    store = SandboxStore(engine)
    run_id = new_sandbox(engine, registry)
    exec_id = store.insert_exec(run_id, NewExec(["true"], b"", {}, "/", 5))
    assert exec_id is not None
    assert not store.append(exec_id, "stdout", 0, 3, b"abc")  # still pending: nothing
    assert store.mark_running(exec_id) is not None

    assert store.append(exec_id, "stdout", 0, 3, b"abc")
    assert not store.append(exec_id, "stdout", 0, 3, b"abc")  # again: refused
    assert not store.append(exec_id, "stdout", 5, 1, b"x")  # a gap: refused
    assert store.append(exec_id, "stdout", 3, 2, b"de")
    assert store.append(exec_id, "stderr", 0, 1, b"!")
    assert store.finish(exec_id, 0, truncated=False, error=None)
    assert not store.finish(exec_id, 1, truncated=False, error=None)
    assert not store.append(exec_id, "stdout", 5, 1, b"f")  # finished: refused

    assert store.ends(exec_id) == (5, 1)
    assert stored_text(store, exec_id) == b"abcde"
    assert exec_row(store, run_id, exec_id).exit_code == 0


def test_two_owners_at_once__every_byte_once_and_one_start(
    engine: Engine, registry: ToolRegistry, servers: list[ExecServer]
):
    store, fake, run_id, exec_id = sandbox_with_command(engine, registry, ["yes"])
    old, new = server(store, fake, run_id), server(store, fake, run_id)
    servers += [old, new]
    old.serve_once()
    expected = bytearray()
    stale = store.tick(run_id, 64)  # what the old owner read before it stalled
    for i in range(30):
        line = f"{i:04d}\n".encode()
        fake.execs[exec_id].stdout += line
        expected += line
        new.serve_once()
        if i % 3 == 0 and stale is not None:
            # The fenced-out owner still runs, on what it read long ago.
            for open_exec in stale.execs:
                old._follow(open_exec, stale)
    fake.execs[exec_id].exit_code = 0
    new.serve_once()
    old.serve_once()

    assert stored_text(store, exec_id) == bytes(expected)
    assert len(fake.execs) == 1
    row = exec_row(store, run_id, exec_id)
    assert (row.status, row.exit_code, row.stdout_end) == ("finished", 0, len(expected))


def test_exec_server__never_splits_a_character_or_a_secret(
    engine: Engine, registry: ToolRegistry, servers: list[ExecServer]
):
    store = SandboxStore(engine)
    fake = FakeSandboxEngine(secrets=["hunter2"])
    run_id = new_sandbox(engine, registry)
    exec_id = store.insert_exec(run_id, NewExec(["sh"], b"", {}, "/", 60))
    assert exec_id is not None
    serving = server(store, fake, run_id)
    servers.append(serving)
    serving.serve_once()
    out = fake.execs[exec_id].stdout

    for piece in (b"caf\xc3", b"\xa9 pass=hun", b"ter2 done\n"):
        out += piece
        serving.serve_once()
        stored = stored_text(store, exec_id)
        stored.decode("utf-8")  # every stored prefix is whole UTF-8
        assert b"hun" not in stored  # a secret's start waits until it is known whole
    fake.execs[exec_id].exit_code = 0
    serving.serve_once()

    assert stored_text(store, exec_id) == "café pass=*** done\n".encode()


def test_exec_server__a_command_whose_wrapper_is_not_there_yet_is_waited_for(
    engine: Engine, registry: ToolRegistry, servers: list[ExecServer]
):
    """The wrapper makes the command's directory in a process of its own, a moment after the
    start: until then the command is starting, not gone."""
    store, fake, run_id, exec_id = sandbox_with_command(engine, registry, ["echo", "hi"])
    serving = server(store, fake, run_id)
    servers.append(serving)
    serving.serve_once()  # started
    starting = fake.execs.pop(exec_id)  # its directory not made yet
    serving.serve_once()
    assert exec_row(store, run_id, exec_id).status == "running"
    starting.stdout += b"hi\n"
    starting.exit_code = 0
    fake.execs[exec_id] = starting
    serving.serve_once()
    row = exec_row(store, run_id, exec_id)
    assert (row.status, row.exit_code, row.error) == ("finished", 0, None)
    assert stored_text(store, exec_id) == b"hi\n"


def test_exec_server__a_command_removed_once_seen_or_never_there_ends_with_why(
    engine: Engine, registry: ToolRegistry, servers: list[ExecServer]
):
    store, fake, run_id, removed = sandbox_with_command(engine, registry, ["sleep", "9"])
    never = store.insert_exec(run_id, NewExec(["sleep", "9"], b"", {}, "/", 60))
    assert never is not None
    serving = server(store, fake, run_id, start_grace_seconds=0.0)
    servers.append(serving)
    serving.serve_once()  # both started
    del fake.execs[never]  # its wrapper never made its directory
    serving.serve_once()  # the other one seen started
    del fake.execs[removed]  # then its directory removed by the sandbox's own processes
    serving.serve_once()
    assert exec_row(store, run_id, never).error == "the command never started"
    assert exec_row(store, run_id, removed).error == "the command's output was removed"
    assert fake.start_calls == 2  # neither started again


def test_exec_server__caps_each_stream_and_kills_an_overdue_command(
    engine: Engine, registry: ToolRegistry, servers: list[ExecServer]
):
    store = SandboxStore(engine)
    fake = FakeSandboxEngine()
    run_id = new_sandbox(engine, registry)
    capped = store.insert_exec(run_id, NewExec(["yes"], b"", {}, "/", 60))
    overdue = store.insert_exec(run_id, NewExec(["sleep", "9"], b"", {}, "/", 1))
    assert capped is not None and overdue is not None
    serving = server(store, fake, run_id, cap=10)
    servers.append(serving)
    serving.serve_once()
    fake.execs[capped].stdout += b"y\n" * 50
    fake.execs[capped].exit_code = 0
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sandbox_execs SET started_at = now() - interval '5 s' WHERE id = :id"),
            {"id": overdue},
        )
    serving.serve_once()
    serving.serve_once()

    assert stored_text(store, capped) == b"y\n" * 5
    assert exec_row(store, run_id, capped).truncated is True
    assert fake.kills == [overdue]
    killed = exec_row(store, run_id, overdue)
    assert (killed.status, killed.exit_code, killed.timed_out) == ("finished", 137, True)


def test_exec_server__a_session_dying_mid_read_loses_and_repeats_no_byte(
    engine: Engine, registry: ToolRegistry, servers: list[ExecServer]
):
    store, fake, run_id, exec_id = sandbox_with_command(engine, registry, ["yes"])
    serving = server(store, fake, run_id, cap=4_000_000)
    servers.append(serving)
    serving.serve_once()  # started through the session
    assert fake.sessions[0].requests == ["s"]
    expected = b"".join(f"{i:07d}\n".encode() for i in range(300_000))  # 2.4 MB: 3 reads
    fake.execs[exec_id].stdout += expected
    fake.execs[exec_id].exit_code = 0
    fake.sessions[0].die_after_bytes = 70_000

    serving.serve_once()
    serving.serve_once()

    assert stored_text(store, exec_id) == expected
    row = exec_row(store, run_id, exec_id)
    assert (row.status, row.exit_code, row.stdout_end) == ("finished", 0, len(expected))
    assert fake.sessions[0].closed  # the broken session is never asked again


def test_exec_wakeups__a_new_command_wakes_its_sandbox_only(
    engine: Engine, registry: ToolRegistry, database_url: str
):
    store = SandboxStore(engine)
    run_id, other = new_sandbox(engine, registry), new_sandbox(engine, registry)
    wakeups = ExecWakeups(database_url)
    try:
        mine, theirs = wakeups.event(run_id), wakeups.event(other)
        assert mine.wait(10)  # set once the listener is connected: a round looks at once
        mine.clear()
        theirs.clear()

        store.insert_exec(run_id, NewExec(["true"], b"", {}, "/", 5))

        assert mine.wait(10)
        assert not theirs.is_set()
    finally:
        wakeups.stop()
