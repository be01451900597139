"""The workflow commands of the CLI against a live API: batch, --after/--at, rerun, events."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from tests.integration.api.cli_support import Api
from tests.integration.api.test_api_helpers import wait_until

# Each command is a Python process of its own (a second or more on two busy cores): the
# full tier runs these; the quick one leaves them out.
pytestmark = pytest.mark.slow

DONE = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"ok": True})
FAILED = AttemptResult(status=RunStatus.FAILED, exit_code=3, error_code="tool_failed", error="x")


def finish_all(api: Api, outcome: AttemptResult = DONE) -> int:
    jobs = api.queue.claim(worker_id="w", engine_id="e", limit=100, lease_seconds=30)
    for job in jobs:
        assert api.queue.finalize(job.job_id, job.lease_token, outcome)
    return len(jobs)


def test_cli_submit_after_and_at__written_on_the_run(api: Api):
    first = api.run("submit", "echo")
    dep = first.stdout.strip()
    second = api.run(
        "submit", "echo", "--after", dep, "--at", "2020-01-01T00:00:00+00:00", "--json"
    )
    assert second.returncode == 0, second.stderr
    run = json.loads(second.stdout)
    assert run["depends_on"] == [dep] and run["run_at"].startswith("2020-01-01")
    bad = api.run("submit", "echo", "--at", "next tuesday")
    assert bad.returncode == 2 and "RFC 3339" in bad.stderr


def test_cli_batch_submit_wait__progress_lines_and_the_outcome_as_exit_code(
    api: Api, tmp_path: Path
):
    spec = {
        "runs": [
            {"ref": "build", "tool": "echo"},
            {"ref": "test", "tool": "echo", "depends_on": ["build"]},
        ]
    }
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(spec))
    with api.start("batch", "submit", str(path), "--wait") as proc:
        wait_until(lambda: finish_all(api))
        wait_until(lambda: finish_all(api, FAILED))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    batch_id = uuid.UUID(out.strip())
    assert f"batch {batch_id}  queued  queued 2" in err
    assert "failed" in err.splitlines()[-1] and "succeeded 1" in err.splitlines()[-1]
    retry = api.run("batch", "retry", str(batch_id), "--json")
    assert retry.returncode == 0, retry.stderr
    assert list(json.loads(retry.stdout)["run_ids"]) == ["test"]
    refused = api.run("batch", "submit", str(tmp_path / "missing.json"))
    assert refused.returncode == 2 and "cannot read the batch file" in refused.stderr


def test_cli_rerun_and_events__new_run_and_ndjson_log(api: Api):
    first = api.run("submit", "echo", "--input", '{"x": 1}').stdout.strip()
    finish_all(api)
    rerun = api.run("rerun", first)
    assert rerun.returncode == 0, rerun.stderr
    new_id = rerun.stdout.strip()
    with api.engine.connect() as conn:
        rerun_of = conn.scalar(
            text("SELECT rerun_of FROM tool_runs WHERE id = :id"), {"id": new_id}
        )
    assert str(rerun_of) == first
    events = api.run("events", first, "--ndjson")
    assert events.returncode == 0, events.stderr
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert lines[-1]["data"]["status"] == "succeeded"
    human = api.run("events", first)
    assert "status" in human.stdout and human.stdout.count("\n") == len(lines)
