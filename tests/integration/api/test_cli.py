"""The ``runyard`` CLI as a real process against a real API (and a stub SSE server) on
loopback: what goes to stdout and stderr, exit codes, long-polling, Ctrl-C, odd events."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI, Request, Response

from runyard.domain.states import RunStatus
from runyard.tenancy.auth import create_api_key
from tests.integration.api.cli_support import CLI, Api
from tests.integration.api.test_api_helpers import live_server, wait_until

# Each command is a Python process of its own (a second or more on two busy cores): the
# full tier runs these; the quick one leaves them out.
pytestmark = pytest.mark.slow


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- submit ---------------------------------------------------------------------------------


def test_cli_submit__stdout_is_only_the_run_id(api: Api):
    done = api.run("submit", "echo", "--input", '{"a": 1}')
    assert done.returncode == 0, done.stderr
    run_id = uuid.UUID(done.stdout.strip())
    assert done.stdout == f"{run_id}\n"
    assert run_id == api.only_run_id()
    assert "queued" in done.stderr


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (RunStatus.SUCCEEDED, 0),
        (RunStatus.FAILED, 1),
        (RunStatus.TIMED_OUT, 3),
        (RunStatus.CANCELLED, 4),
    ],
)
def test_cli_submit_wait__long_polls_and_exit_code_is_the_outcome(
    api: Api, status: RunStatus, code: int
):
    with api.start("submit", "echo", "--input", '{"a": 1}', "--wait") as waiting:
        # Let the CLI go through at least one one-second long-poll before the run ends.
        wait_until(lambda: sum("wait=" in q for _, _, q in api.requests) >= 2, timeout=30)
        api.finish(status, result={"a": 1} if status is RunStatus.SUCCEEDED else None)
        out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == code, err
    assert (json.loads(out) == {"a": 1}) if status is RunStatus.SUCCEEDED else out == ""
    assert status.value in err
    # Only POSTs of the same run (the Idempotency-Key replays it), each after the first a
    # long-poll; no GET polling.
    assert {(m, p) for m, p, _ in api.requests} == {("POST", "/v1/runs")}
    assert all("wait=" in q for _, _, q in api.requests[1:])
    assert api.only_run_id()


def test_cli_submit_wait_json__stdout_is_the_final_run(api: Api):
    with api.start("submit", "echo", "--input", '{"b": 2}', "--wait", "--json") as waiting:
        run_id = api.finish(RunStatus.SUCCEEDED, result={"b": 2})
        out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    run = json.loads(out)
    assert run["id"] == str(run_id) and run["status"] == "succeeded" and run["result"] == {"b": 2}


# --- JSON -------------------------------------------------------------------------------------


def test_cli_json__is_the_document_the_api_sent(api: Api, tmp_path: Path):
    run_id = api.run("submit", "echo", "--input", '{"b": [1, "x"], "a": 1.0}').stdout.strip()
    api.finish(RunStatus.SUCCEEDED, result={"z": 1.5, "a": None, "nested": {"y": [True]}})
    path = tmp_path / "batch.json"
    path.write_text(json.dumps([{"ref": "one", "tool": "echo"}, {"tool": "echo"}]))
    batch_id = api.run("batch", "submit", str(path)).stdout.strip()
    headers = {"Authorization": f"Bearer {api.key}"}
    for args, url_path, params in [
        (["get", run_id], f"/v1/runs/{run_id}", {}),
        (["ls", "--limit", "2"], "/v1/runs", {"limit": "2"}),
        (["tools"], "/v1/tools", {}),
        (["batch", "get", batch_id], f"/v1/batches/{batch_id}", {}),
    ]:
        shown = api.run(*args, "--json")
        assert shown.returncode == 0, shown.stderr
        sent = httpx2.get(api.url + url_path, params=params, headers=headers).json()
        # The same keys in the same order with the same values, as the API wrote them.
        assert shown.stdout == json.dumps(sent, indent=2) + "\n", args


# --- exit codes and errors -------------------------------------------------------------------


@pytest.mark.slow  # sits out the client's retries of an unreachable API
def test_cli_errors__api_error_unreachable_and_usage_have_their_codes(api: Api):
    missing = api.run("get", str(uuid.uuid4()))
    assert missing.returncode == 5 and "404" in missing.stderr
    refused = api.run("ls", "--url", f"http://127.0.0.1:{closed_port()}")
    assert refused.returncode == 6 and "cannot reach" in refused.stderr
    bad_key = api.run("ls", "--api-key", "nope")
    assert bad_key.returncode == 5 and "401" in bad_key.stderr
    usage = api.run("submit", "echo", "--input", "{")
    assert usage.returncode == 2 and "not valid JSON" in usage.stderr
    for done in (missing, refused, bad_key, usage):
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_cli_ls__the_table_ends_with_a_newline(api: Api):
    empty = api.run("ls")
    assert empty.returncode == 0 and empty.stdout.endswith("\n")
    assert empty.stdout.splitlines()[0].startswith("ID")
    api.run("submit", "echo")
    listed = api.run("ls")
    assert listed.stdout.endswith("\n") and len(listed.stdout.splitlines()) == 2


# --- Ctrl-C ---------------------------------------------------------------------------------


def test_cli_submit_wait__ctrl_c_exits_130_without_a_traceback(api: Api):
    with api.start("submit", "echo", "--wait") as waiting:
        wait_until(lambda: any("wait=" in q for _, _, q in api.requests), timeout=30)
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 130
    assert "Traceback" not in err and out == ""
    assert str(api.only_run_id()) in err  # the run goes on: the message names it


def test_cli_logs_follow__ctrl_c_exits_130_without_a_traceback(api: Api):
    run_id = api.run("submit", "echo").stdout.strip()
    with api.start("logs", "--follow", run_id) as following:
        wait_until(lambda: any(p.endswith("/events") for _, p, _ in api.requests), timeout=30)
        following.send_signal(signal.SIGINT)
        _, err = following.communicate(timeout=30)
    assert following.returncode == 130
    assert "Traceback" not in err


# --- odd event streams ----------------------------------------------------------------------


def sse(*events: str) -> bytes:
    return "".join(events).encode()


def stub_sse_api(streams: list[bytes], last_ids: list[str | None], final: str) -> FastAPI:
    """A stand-in API: the run is running while event streams remain, then ``final``."""
    app = FastAPI()

    @app.get("/v1/runs/{run_id}")
    def get_run(run_id: str) -> dict[str, Any]:
        return {"id": run_id, "tool": "echo", "status": "running" if streams else final}

    @app.get("/v1/runs/{run_id}/events")
    def events(run_id: str, request: Request) -> Response:
        last_ids.append(request.headers.get("last-event-id"))
        body = streams.pop(0) if streams else b""
        return Response(body, media_type="text/event-stream")

    return app


def test_cli_logs_follow__survives_any_event_and_resumes_after_a_dropped_stream():
    big = "x" * (2 * 1024 * 1024)
    at = "2026-01-01T00:00:00+00:00"  # every event of the API carries its time

    def data(**fields: object) -> str:
        return json.dumps({"at": at, **fields})

    def chunk(text: str) -> str:  # a log chunk as the API sends it
        return data(attempt=1, until=at, text=text)

    first = sse(
        "retry: 100\n\n",
        ": keepalive\n\n",
        'id: 1\nevent: claimed\ndata: {"worker": "w"}\n\n',  # not a log event
        "id: 2\nevent: brand-new-type\ndata: whatever\n\n",  # unknown type
        "id: 3\nevent: stdout\ndata: not json at all\n\n",  # malformed: skipped
        "id: 4\nevent: stdout\ndata: [1, 2]\n\n",  # JSON, but not an object: skipped
        f'id: 5\nevent: stdout\ndata: {{"at": "{at}", "attempt": 1, "until": "{at}",'
        '"text":\ndata: "multi\\n"}\n\n',  # 2 data lines
        f"id: 6\nevent: stdout\ndata: {chunk(big + chr(10))}\n\n",  # > 1 MiB
        "id: 7\nevent: status\ndata: {broken\n\n",  # a status that is not JSON
        f"id: 8\r\nevent: stderr\r\ndata: {chunk('to stderr' + chr(10))}\r\n\r\n",  # CRLF
        "id: 9\nevent: stdout\ndata: " + json.dumps({"text": "cut off"}),  # stream drops
    )
    second = sse(
        f"id: 10\nevent: stdout\ndata: {chunk('after resume' + chr(10))}\n\n",
        f"id: 11\nevent: status\ndata: {data(status='failed')}\n\n",
    )
    last_ids: list[str | None] = []
    app = stub_sse_api([first, second], last_ids, final="failed")
    with live_server(app) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
        done = subprocess.run(
            [*CLI, "logs", "--follow", str(uuid.uuid4()), "--url", url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr  # the run failed
    assert done.stdout == "multi\n" + big + "\nafter resume\n"
    assert "to stderr\n" in done.stderr and "skipped 3 malformed" in done.stderr
    assert "Traceback" not in done.stderr
    assert last_ids == [None, "8"]  # resumed after the last complete event


# --- rm and webhook -------------------------------------------------------------------------


def test_cli_rm__deletes_terminal_runs_and_refuses_a_live_one(api: Api):
    run_id = api.run("submit", "echo").stdout.strip()
    live = api.run("rm", run_id)
    assert live.returncode == 5 and "409 run_not_finished" in live.stderr
    api.finish(RunStatus.CANCELLED)
    done = api.run("rm", run_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"deleted {run_id}\n"
    assert api.only_run_id() is None
    assert api.run("rm", run_id).returncode == 5


def test_cli_webhook__set_prints_the_secret_once_and_verify_checks_a_delivery(
    api: Api, tmp_path: Path
):
    from runyard.webhooks.delivery import signed_headers

    admin = create_api_key(api.engine, "ops", admin=True)
    env = api.env() | {"RUNYARD_API_KEY": admin}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)

    made = cli("webhook", "set", "acme", "--json")
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["secret"]
    assert secret.startswith("whsec_")
    again = cli("webhook", "set", "acme", "--events", "run.started,run.completed")
    assert again.returncode == 0 and "whsec_" not in again.stdout
    assert "events: run.started, run.completed" in again.stdout
    unknown = cli("webhook", "set", "acme", "--events", "run.exploded")
    assert unknown.returncode == 2 and "run.exploded" in unknown.stderr
    assert api.run("webhook", "set", "acme").returncode == 5  # not an admin key

    body = tmp_path / "body.json"
    body.write_bytes(b'{"id":"r1","status":"succeeded"}')
    from datetime import UTC, datetime

    headers = signed_headers(secret, "msg-1", body.read_bytes(), datetime.now(UTC))
    flags = [
        f"--id={headers['webhook-id']}",
        f"--timestamp={headers['webhook-timestamp']}",
        f"--signature={headers['webhook-signature']}",
    ]
    good = cli("webhook", "verify", str(body), *flags, "--secret", secret)
    assert (good.returncode, good.stderr) == (0, "signature valid\n")
    body.write_bytes(b'{"id":"r1","status":"failed"}')
    bad = cli("webhook", "verify", str(body), *flags, "--secret", secret)
    assert bad.returncode == 1 and "NOT valid" in bad.stderr
    assert cli("webhook", "verify", str(body), *flags).returncode == 2  # no secret given
