"""The tools page shows what each tool's runs consumed this month, of the viewer's tenant."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.domain.usage import AttemptUsage
from runyard.queue import JobQueue, NewRun
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from runyard.usage.ledger import Recorded, UsageLedger
from tests.integration.api.test_api_helpers import make_app
from tests.integration.api.test_ui_http import log_in


def metered(engine: Engine, queue: JobQueue, tenant: str, cpu_seconds: float) -> None:
    queue.enqueue(NewRun(tenant=tenant, tool="echo", spec={}, input={}))
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
    usage = AttemptUsage(cpu_seconds, memory_peak_bytes=5 << 20, memory_avg_bytes=1, wall_seconds=3)
    assert UsageLedger(engine).record(job.job_id, job.lease_token, usage) is Recorded.RECORDED


def test_tools_page__shows_the_tenants_usage_of_the_month(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue
):
    metered(engine, queue, "acme", 1.5)
    metered(engine, queue, "acme", 2.0)
    metered(engine, queue, "globex", 100.0)
    with engine.begin() as conn:  # an image build of echo charged to acme
        conn.execute(
            text(
                "INSERT INTO build_usage (build_id, started_at, tag, tool, engine_id, tenant, "
                "wall_seconds, cpu_seconds, memory_peak_bytes) VALUES "
                "(gen_random_uuid(), now(), 't', 'echo', 'e', 'acme', 5, 7.25, 1)"
            )
        )
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as client:
        log_in(client, create_api_key(engine, "acme"))
        page = client.get("/ui/tools").text
    echo = re.search(r'<dl class="facts tool-usage" id="usage-echo">(.*?)</dl>', page, re.S)
    assert echo is not None
    assert '<dd class="cpu">3.5 s</dd>' in echo.group(1)  # acme's own, never globex's
    assert '<dd class="peak">5.0 MiB</dd>' in echo.group(1)
    assert '<dd class="attempts">2</dd>' in echo.group(1)
    assert '<dd class="builds">1, 7.2 s CPU</dd>' in echo.group(1)  # its own line, not the runs'
    sleep = re.search(r'id="usage-sleep">(.*?)</dl>', page, re.S)
    assert sleep is not None and '<dd class="attempts">0</dd>' in sleep.group(1)
