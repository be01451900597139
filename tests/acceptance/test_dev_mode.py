"""``runyard dev`` as a real process: embedded Postgres, API, worker and reaper together."""

from __future__ import annotations

import http.client as http_client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.sdk.test_python_docs import python_blocks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(method: str, url: str, body: object | None = None) -> tuple[int, dict[str, object]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def wait_ready(proc: subprocess.Popen[bytes], base: str, log_path: Path) -> None:
    """Until the stack answers ``/readyz`` (two minutes at most, while the process lives)."""
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            if http("GET", f"{base}/readyz")[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.3)


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """A data directory for the embedded Postgres outside pytest's own temporary tree.

    The embedded server runs as another user, so the folders above its data directory are
    opened to others for traversal; any pytest session that starts meanwhile on this machine
    (another checkout's suite) makes its temporary root private again, and the server could
    no longer be stopped. A folder of its own under the system's temporary directory keeps
    its permissions.
    """
    made = Path(tempfile.mkdtemp(prefix="runyard-dev-test-"))
    try:
        yield made / "pg"
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.mark.timeout(240)
def test_dev__echo_run_succeeds_with_embedded_postgres(tmp_path: Path, pg_dir: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")} | {
        "RUNYARD_TOOLS_FILE": str(ROOT / "tests" / "tools.toml"),
        "RUNYARD_WORKER_POLL_SECONDS": "0.2",
    }
    log = (tmp_path / "dev.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runyard.cli",
            "dev",
            "--port",
            str(port),
            "--data-dir",
            str(pg_dir),
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, base, tmp_path / "dev.log")
        status, run = http("POST", f"{base}/v1/runs", {"tool": "echo", "input": {"hi": 1}})
        assert status == 202 and run["status"] in ("queued", "running")
        deadline = time.monotonic() + 60
        while run["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.3)
            run = http("GET", f"{base}/v1/runs/{run['id']}")[1]
        assert run["status"] == "succeeded", run
        assert run["result"] == {"hi": 1}
        banner = (tmp_path / "dev.log").read_text()
        assert "auth is OFF" in banner and f"{base}/v1/runs" in banner
        assert f"dashboard: {base}/ui/\n" in banner and f"API docs:  {base}/docs\n" in banner
        assert f"(embedded, data in {pg_dir.resolve()})" in banner
        front = http_client.HTTPConnection("127.0.0.1", port, timeout=10)
        front.request("GET", "/")
        answer = front.getresponse()
        assert (answer.status, answer.getheader("location")) == (307, "/ui/")
        front.close()
        # The default input mode: host work directories beside the engine when root (the
        # probe proves the engine sees them), uploads otherwise; the banner says which.
        inputs = "host" if os.geteuid() == 0 else "upload"
        assert f"inputs: {inputs} (RUNYARD_HOST_WORKDIR_ROOT=auto)" in banner

        # The CLI client against the same server.
        cli = [sys.executable, "-m", "runyard.cli"]
        cli_env = {**env, "RUNYARD_URL": base}
        done = subprocess.run(
            [*cli, "submit", "echo", "--input", '{"via": "cli"}', "--wait", "--json"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["result"] == {"via": "cli"}
        failed = subprocess.run(
            [*cli, "submit", "fail", "--wait"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        # The outcome is the exit code; the status line goes to stderr, stdout is the result.
        assert failed.returncode == 1 and "exit=3" in failed.stderr and failed.stdout == ""

        submitted = subprocess.run(
            [*cli, "submit", "sleep", "--input", '{"seconds": 6}', "--json"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        run_id = json.loads(submitted.stdout)["id"]
        follow = subprocess.Popen(
            [*cli, "logs", "--follow", run_id], env=cli_env, stdout=subprocess.PIPE, text=True
        )
        assert follow.stdout is not None
        first_line = follow.stdout.readline()
        first_line_at = datetime.now(UTC)
        rest = follow.stdout.read()
        follow.stdout.close()
        assert follow.wait(timeout=60) == 0
        assert first_line == "sleeping 6\n" and rest == "done\n"
        # Streamed live, not printed at the end: the line came before the run finished (the
        # embedded database shares this host's clock). Asking for the status instead raced
        # the run's seconds on a loaded machine; the CLI's own start, seconds of CPU on two
        # slow busy cores, took more than two of them.
        finished_at = http("GET", f"{base}/v1/runs/{run_id}")[1]["finished_at"]
        assert first_line_at < datetime.fromisoformat(str(finished_at))

        # The Python SDK's tour, as docs/python.md prints it, against the same stack.
        tour = subprocess.run(
            [sys.executable, "-c", python_blocks()[0]],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert tour.returncode == 0, tour.stderr
        assert "422 unknown_tool" in tour.stdout

        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            scraped = response.read().decode()
        assert 'runyard_queue_depth{queue="default",status="queued"} 0.0' in scraped
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert not (pg_dir / "postmaster.pid").exists(), "embedded Postgres left running"


@pytest.mark.timeout(180)
def test_dev__sigterm_stops_the_embedded_postgres_too(tmp_path: Path, pg_dir: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    env["RUNYARD_TOOLS_FILE"] = str(ROOT / "tests" / "tools.toml")
    command = [sys.executable, "-m", "runyard.cli", "dev", "--port", str(port)]
    with (tmp_path / "dev.log").open("w") as log:
        proc = subprocess.Popen(
            [*command, "--data-dir", str(pg_dir)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_ready(proc, f"http://127.0.0.1:{port}", tmp_path / "dev.log")
    assert (pg_dir / "postmaster.pid").exists()
    proc.send_signal(signal.SIGTERM)  # as a service manager or `docker stop` would
    proc.wait(timeout=60)
    assert not (pg_dir / "postmaster.pid").exists(), (tmp_path / "dev.log").read_text()
