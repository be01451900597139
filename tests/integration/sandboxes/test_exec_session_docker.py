"""The exec session on the real engine: a command's arguments, environment and directory
reach it whole, its exit wakes the owner, a command posing as the session is never believed,
and a session killed under a read leaves every byte to the per-call way."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import docker
import pytest

from runyard.runners.docker.sandbox_engine import DockerSandboxEngine
from runyard.sandbox_engine import KEEPER, ExecFiles
from runyard.sandboxes.channel import ExecChannel
from runyard.sandboxes.fake import pending_exec

TOOLBOX = "runyard/toolbox:latest"

pytestmark = pytest.mark.docker

# The session's pids, as the sandbox's own user can find them (the bracket keeps the
# script that looks from finding itself; a process gone between the glob and the read is
# silenced before its redirection fails, so it prints nothing).
SESSION_PIDS = (
    "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null <$p/cmdline "
    "| grep -q 'runyard-[s]ession' && echo ${p#/proc/}; done; true"
)


PRINT_ARGS = 'printf "%s|%s|" "$1" "$GREETING"; pwd; echo oops >&2; exit 3'


def wait_exit(poll: Callable[[uuid.UUID], ExecFiles], exec_id: uuid.UUID) -> ExecFiles:
    """The command's files once it exited (within 10 s)."""
    deadline = time.monotonic() + 10
    while (files := poll(exec_id)).exit_code is None:
        assert time.monotonic() < deadline, files
        time.sleep(0.02)
    return files


@pytest.fixture
def box(docker_client: docker.DockerClient) -> Iterator[str]:
    """A container as a sandbox's: the keeper, the tool's user, tini, no network."""
    container = docker_client.containers.run(
        TOOLBOX,
        ["-c", KEEPER],
        entrypoint=["/bin/sh"],
        name=f"runyard-session-test-{uuid.uuid4().hex[:12]}",
        detach=True,
        user="65534:65534",
        network_mode="none",
        init=True,
        tmpfs={"/runyard/out": "uid=65534,gid=65534,mode=0700"},
    )
    try:
        deadline = time.monotonic() + 10
        while container.exec_run(["test", "-d", "/runyard/out/.execs"]).exit_code != 0:
            assert time.monotonic() < deadline, "the keeper never made its directories"
            time.sleep(0.05)
        yield str(container.name)
    finally:
        container.remove(force=True)


def test_docker_session__runs_a_command_whole_and_wakes_on_its_exit(
    docker_client: docker.DockerClient, box: str
):
    engine = DockerSandboxEngine(docker_client)
    woken = threading.Event()
    session = engine.open_session(box, woken.set)
    exec_id = uuid.uuid4()
    try:
        session.start(
            exec_id,
            ["sh", "-c", PRINT_ARGS, "-", "a b\nc \\0101 é*"],
            env={"GREETING": "hi  there\n"},
            cwd="/tmp",
        )
        assert woken.wait(10)
        files = wait_exit(session.poll, exec_id)
        expected = "a b\nc \\0101 é*|hi  there\n|/tmp\n".encode()
        assert files == ExecFiles(True, 3, len(expected), 5)
        assert session.read(exec_id, "stdout", 0, 1_000) == expected
        assert session.read(exec_id, "stdout", 2, 3) == expected[2:5]
        assert session.read(exec_id, "stderr", 0, 1_000) == b"oops\n"
        assert session.poll(uuid.uuid4()) == ExecFiles(started=False)

        sleeper = uuid.uuid4()
        session.start(sleeper, ["sleep", "60"], env={}, cwd="/")
        session.kill(sleeper)
        assert wait_exit(session.poll, sleeper).exit_code == 137
    finally:
        session.close()


def test_docker_session__a_command_posing_as_the_session_is_never_believed(
    docker_client: docker.DockerClient, box: str
):
    engine = DockerSandboxEngine(docker_client)
    channel = ExecChannel(engine, box)
    channel.ensure_open()
    assert channel.open
    hostile = uuid.uuid4()
    # Frames on its own stdout (a file), then forged answers and notices written straight
    # into every session's stdout and stderr it can find.
    script = (
        'printf "0123456789abcdef p 0 1 1\\nx %s\\n\\001\\000\\000\\000\\000\\000\\000\\005" "$1"; '
        f"for p in $({SESSION_PIDS}); do "
        'printf "0123456789abcdef p 0 999 999\\n" 2>/dev/null >/proc/$p/fd/1; '
        'printf "x forged\\n" 2>/dev/null >/proc/$p/fd/2; done; echo done'
    )
    channel.start(pending_exec(hostile, ["sh", "-c", script, "-", str(hostile)]), None, "")
    files = wait_exit(channel.poll, hostile)

    printed = f"0123456789abcdef p 0 1 1\nx {hostile}\n".encode() + b"\x01" + b"\x00" * 6
    expected = printed + b"\x05done\n"
    assert files == ExecFiles(True, 0, len(expected), 0)
    assert channel.read(hostile, "stdout", 0, 1_000) == expected
    assert channel.broken == 1  # the forged answer came without a request: never taken


def test_docker_session__killed_under_a_read_leaves_every_byte_to_the_fallback(
    docker_client: docker.DockerClient, box: str
):
    engine = DockerSandboxEngine(docker_client)
    channel = ExecChannel(engine, box)
    channel.ensure_open()
    writer, sleeper = uuid.uuid4(), uuid.uuid4()
    channel.start(pending_exec(writer, ["sh", "-c", "seq 1 400000"]), None, "")
    channel.start(pending_exec(sleeper, ["sh", "-c", "sleep 1; echo still here"]), None, "")
    size = wait_exit(channel.poll, writer).stdout_size
    expected = "".join(f"{i}\n" for i in range(1, 400_001)).encode()
    assert size == len(expected)

    container = docker_client.containers.get(box)
    killer = threading.Thread(
        target=container.exec_run, args=(["sh", "-c", f"kill -9 $({SESSION_PIDS})"],)
    )
    got = bytearray(channel.read(writer, "stdout", 0, 1_000_000))
    killer.start()
    while len(got) < size:
        got += channel.read(writer, "stdout", len(got), min(1_000_000, size - len(got)))
    killer.join()
    assert bytes(got) == expected

    # The command the dead session started runs on and is read the per-call way.
    files = wait_exit(channel.poll, sleeper)
    assert (files.exit_code, files.stdout_size) == (0, len(b"still here\n"))
    # As the owner reads (``ExecServer._pump``): a read that comes back empty is made again
    # at its next round. One engine exec per read: on a loaded machine one came back empty.
    deadline = time.monotonic() + 10
    while not (out := channel.read(sleeper, "stdout", 0, 100)):
        assert time.monotonic() < deadline, "the per-call read never answered"
        time.sleep(0.1)
    assert out == b"still here\n"
    assert channel.broken == 1 and not channel.open
