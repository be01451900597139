"""Sandboxes on the real Docker engine: commands with stdin, env and cwd, concurrent commands,
streamed output, and the ends of a sandbox (delete, TTL, idle)."""

from __future__ import annotations

import json
import time
from typing import Any

import docker
import pytest

from tests.integration.sandboxes.conftest import Stack

pytestmark = pytest.mark.docker

# An SSE message as read: its id, its event name, its data.
Event = tuple[str | None, str | None, Any]


def test_exec__round_trip_with_stdin_env_and_cwd(stack: Stack):
    sandbox = stack.create()
    sid = sandbox["id"]
    made = stack.run(sid, ["sh", "-c", "mkdir -p src && echo kept > src/file && pwd"])
    assert made["exit_code"] == 0 and made["stdout"] == "/runyard/out/workspace\n"

    found = stack.run(
        sid,
        ["sh", "-c", 'cat file; echo "$GREETING"; wc -c; pwd; echo oops >&2; exit 3'],
        stdin="twelve bytes",
        env={"GREETING": "hello"},
        cwd="src",
    )

    assert found["status"] == "finished" and found["exit_code"] == 3
    assert found["stdout"] == "kept\nhello\n12\n/runyard/out/workspace/src\n"
    assert found["stderr"] == "oops\n"
    assert found["timed_out"] is False and found["error"] is None


@pytest.mark.slow
def test_exec__a_missing_program_and_a_timeout_say_so(stack: Stack):
    sid = stack.create()["id"]

    missing = stack.run(sid, ["no-such-program"])
    slow = stack.run(sid, ["sleep", "30"], timeout_seconds=1)

    assert missing["exit_code"] == 127 and "no-such-program" in missing["stderr"]
    assert slow["timed_out"] is True and slow["exit_code"] == 137


@pytest.mark.slow
def test_execs__run_concurrently_up_to_the_sandbox_limit(stack: Stack):
    sid = stack.create(max_execs=2)["id"]
    # Each command holds its place until the test uploads ``go`` (at most 30 s): none can
    # end before the test has seen two running and the third waiting, however slow the
    # machine.
    held = "echo start; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"
    ids = [
        stack.client.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["sh", "-c", held]}).json()[
            "id"
        ]
        for _ in range(3)
    ]

    def started() -> list[str]:
        return [stack.client.get(f"/v1/sandboxes/{sid}/execs/{i}").json()["status"] for i in ids]

    deadline = time.monotonic() + 20
    while (seen := started()).count("running") < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert sorted(seen) == ["pending", "running", "running"]  # the third waits for a place
    assert stack.client.put(f"/v1/sandboxes/{sid}/files/go", content=b"").status_code == 200
    finished = [
        stack.client.get(f"/v1/sandboxes/{sid}/execs/{i}", params={"wait": 20}).json() for i in ids
    ]
    assert [(f["status"], f["stdout"]) for f in finished] == [("finished", "start\n")] * 3


@pytest.mark.slow  # a sandbox held for seconds
def test_exec_events__stream_the_output_then_the_exit_and_resume(stack: Stack):
    sid = stack.create()["id"]
    exec_id = stack.client.post(
        f"/v1/sandboxes/{sid}/exec",
        json={"command": ["sh", "-c", "echo one; sleep 0.5; echo two >&2; sleep 0.5; echo three"]},
    ).json()["id"]
    path = f"/v1/sandboxes/{sid}/execs/{exec_id}/events"

    events = read_events(stack, path)
    resumed = read_events(stack, path, last_event_id=events[0][0])

    texts = [(kind, data) for _, kind, data in events]
    assert "".join(d["text"] for k, d in texts if k == "stdout") == "one\nthree\n"
    assert "".join(d["text"] for k, d in texts if k == "stderr") == "two\n"
    assert texts[-1] == (
        "exit",
        {"exit_code": 0, "timed_out": False, "error": None, "truncated": False},
    )
    assert [kind for _, kind, _ in resumed] == [kind for _, kind, _ in events[1:]]


def read_events(stack: Stack, path: str, last_event_id: str | None = None) -> list[Event]:
    """The events of an SSE stream, read to its end: (id, event, data)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events: list[Event] = []
    with stack.client.stream("GET", path, headers=headers) as answer:
        assert answer.status_code == 200
        event_id = kind = None
        for line in answer.iter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((event_id, kind, json.loads(line[6:])))
    return events


@pytest.mark.slow  # a sandbox held for seconds
def test_delete__ends_the_sandbox_and_keeps_its_record(stack: Stack):
    sid = stack.create()["id"]

    answer = stack.client.delete(f"/v1/sandboxes/{sid}")
    ended = stack.wait_status(sid, "ended")
    refused = stack.client.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]})

    assert answer.status_code == 200
    assert ended["end_reason"] == "deleted"
    assert refused.status_code == 409 and refused.json()["code"] == "sandbox_ended"
    listed = stack.client.get("/v1/sandboxes").json()["sandboxes"]
    assert [s["id"] for s in listed] == [sid]


@pytest.mark.slow
def test_ttl_and_idle__end_the_sandbox_with_their_reason(stack: Stack):
    short = stack.create(ttl_seconds=4)["id"]
    idle = stack.create(idle_timeout_seconds=2)["id"]
    stack.run(idle, ["true"])  # an exec restarts the idle clock

    idle_end = stack.wait_status(idle, "ended", timeout=20)
    ttl_end = stack.wait_status(short, "ended", timeout=20)

    assert idle_end["end_reason"] == "idle"
    assert ttl_end["end_reason"] == "ttl"


@pytest.mark.slow  # sits out the owner's notice of a dead container
def test_container_killed_outside__the_sandbox_ends_container_exited(
    stack: Stack, docker_client: docker.DockerClient
):
    sid = stack.create()["id"]

    docker_client.api.kill(f"runyard-{sid}-1")
    ended = stack.wait_status(sid, "ended", timeout=30)
    refused = stack.client.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]})

    assert ended["end_reason"] == "container_exited"
    assert "stopped by itself" in ended["error"]
    assert refused.status_code == 409
