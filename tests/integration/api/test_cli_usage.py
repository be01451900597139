"""``runyard usage`` as a real process against the API: the table, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from runyard.domain.usage import AttemptUsage
from runyard.usage.ledger import Recorded, UsageLedger
from tests.integration.api.cli_support import Api

# Each command is a Python process of its own (a second or more on two busy cores): the
# full tier runs these; the quick one leaves them out.
pytestmark = pytest.mark.slow


def metered_run(api: Api, cpu_seconds: float) -> None:
    """A run of acme (the CLI's tenant) submitted, claimed and metered."""
    assert api.run("submit", "echo", "--input", "{}").returncode == 0
    [job] = api.queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
    usage = AttemptUsage(cpu_seconds, memory_peak_bytes=3 << 20, memory_avg_bytes=1, wall_seconds=1)
    assert UsageLedger(api.engine).record(job.job_id, job.lease_token, usage) is Recorded.RECORDED


def test_cli_usage__table_csv_and_json_agree(api: Api):
    metered_run(api, 1.25)
    metered_run(api, 0.5)
    table = api.run("usage")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("usage of acme, ")
    assert lines[2].split()[:5] == ["echo", "run", "2", "2", "1.75"]
    assert lines[3].split()[:3] == ["total", "all", "2"]

    as_csv = api.run("usage", "--by", "day", "--csv")
    [row] = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert row["day"] == datetime.now(UTC).date().isoformat()
    assert (float(row["cpu_seconds"]), row["memory_peak_bytes"]) == (1.75, str(3 << 20))
    assert row["kind"] == "run"

    as_json = json.loads(api.run("usage", "--json").stdout)
    assert as_json["tenant"] == "acme" and as_json["total"]["cpu_seconds"] == 1.75


def test_cli_usage__another_tenant_is_not_found(api: Api):
    refused = api.run("usage", "--tenant", "globex")
    assert refused.returncode == 5 and "404 tenant_not_found" in refused.stderr
