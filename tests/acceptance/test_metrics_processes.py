"""Real runs move every defined series where Prometheus reads them: ``runyard dev``'s one
``/metrics``, and in the split services the API's ``/metrics`` and the worker's and
reaper's own ports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from runyard.reads.metrics import Role
from tests.acceptance.cluster import ROOT, Cluster
from tests.acceptance.test_dev_mode import free_port, http, wait_ready
from tests.metrics_support import still_zero
from tests.webhook_receiver import Receiver, receiver_on

pytestmark = pytest.mark.docker

RUNS = 3
DEV = [sys.executable, "-m", "runyard.cli", "dev"]
# Runs are pruned three seconds after they finish, so the reaper has something to count.
SHORT_RETENTION = {"RUNYARD_RETENTION_DAYS": str(3 / 86400), "RUNYARD_WEBHOOK_POLL_SECONDS": "0.2"}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def until_all_moved(url: str, roles: tuple[Role, ...], timeout: float = 90) -> list[str]:
    """The series of ``roles`` that ``url`` still shows at zero once all moved or
    ``timeout`` passed (the reaper prunes and webhooks arrive a little after the runs)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = scrape(url)
        except OSError:  # the process is still starting
            text = ""
        left = still_zero(text, *roles)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def submit_runs(base: str, receiver: Receiver) -> None:
    """Configure the webhook of the tenant ``dev`` (auth is off) and submit echo runs that
    call it back, and one for a tool that does not exist."""
    status, _ = http("PUT", f"{base}/v1/tenants/dev/webhook", {"url": None})
    assert status == 200
    for n in range(RUNS):
        body = {"tool": "echo", "input": {"n": n}, "callback_url": receiver.url}
        assert http("POST", f"{base}/v1/runs", body)[0] == 202
    with pytest.raises(urllib.error.HTTPError) as refused:
        http("POST", f"{base}/v1/runs", {"tool": "no-such-tool", "input": {}})
    refused.value.close()
    assert refused.value.code == 422


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """The embedded Postgres's data directory, outside pytest's temporary tree (see
    ``tests/acceptance/test_dev_mode.py`` for why)."""
    made = Path(tempfile.mkdtemp(prefix="runyard-dev-metrics-"))
    try:
        yield made / "pg"
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.mark.timeout(300)
def test_dev__one_metrics_page_shows_every_part_moving(tmp_path: Path, pg_dir: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")} | {
        "RUNYARD_TOOLS_FILE": str(ROOT / "tests" / "tools.toml"),
        "RUNYARD_WORKER_POLL_SECONDS": "0.2",
        "RUNYARD_REAPER_INTERVAL_SECONDS": "0.5",
        **SHORT_RETENTION,
    }
    log_path = tmp_path / "dev.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*DEV, "--port", str(port), "--data-dir", str(pg_dir)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, base, log_path)
        with receiver_on() as receiver:
            submit_runs(base, receiver)
            assert until_all_moved(f"{base}/metrics", tuple(Role)) == [], log_path.read_text()
            assert receiver.received
    finally:
        proc.send_signal(2)  # SIGINT, as Ctrl-C
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.timeout(300)
def test_split_services__each_process_serves_its_own_moving_series(cluster: Cluster):
    worker_port, reaper_port = free_port(), free_port()
    cluster.env.update({"RUNYARD_WEBHOOK_ALLOW_LOOPBACK": "true", **SHORT_RETENTION})
    cluster.start_api("api", RUNYARD_QUEUE_ENABLED="true")
    cluster.start_worker("w1", RUNYARD_WORKER_METRICS_PORT=str(worker_port))
    cluster.start_reaper(RUNYARD_REAPER_METRICS_PORT=str(reaper_port))
    base = f"http://127.0.0.1:{cluster.ports['api']}"
    worker_metrics = f"http://127.0.0.1:{worker_port}/metrics"
    reaper_metrics = f"http://127.0.0.1:{reaper_port}/metrics"
    with receiver_on() as receiver:
        submit_runs(base, receiver)
        assert until_all_moved(worker_metrics, (Role.WORKER, Role.ATTEMPTS)) == []
        assert until_all_moved(reaper_metrics, (Role.REAPER, Role.WEBHOOKS)) == []
        assert until_all_moved(f"{base}/metrics", (Role.API,)) == []
    # Each serves its own: the API has no worker series, the reaper none of the API's.
    assert "runyard_worker_engine_up" not in scrape(f"{base}/metrics")
    assert "runyard_api_submissions" not in scrape(reaper_metrics)
    assert "runyard_reaper_actions" not in scrape(worker_metrics)
