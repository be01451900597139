"""The services behind PgBouncer in transaction mode: API, worker and reaper processes reach
Postgres only through the pooler (LISTEN on a direct URL in one variant, none in the other),
real runs succeed, a ``?wait`` answer and an SSE stream arrive, and no process or the pooler
logs a session-state error."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx2
import pytest
from psycopg.conninfo import conninfo_to_dict

from bench.pgbouncer import PgBouncer, find_pgbouncer, start_pgbouncer
from tests.acceptance.cluster import Cluster, Expected

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        find_pgbouncer() is None, reason="no pgbouncer (scripts/ensure-pgbouncer installs it)"
    ),
]

# What a session-scoped feature used through a transaction pooler would log: a prepared
# statement missing or already there on the server connection at hand, startup options
# refused, a LISTEN connection dropped.
SESSION_ERRORS = (
    'prepared statement "',
    "DuplicatePreparedStatement",
    "InvalidSqlStatementName",
    "unsupported startup parameter",
    "listen connection lost",
)


@pytest.fixture
def pgbouncer(postgres_server_url: str) -> Iterator[PgBouncer]:
    bouncer = start_pgbouncer(postgres_server_url, pool_size=5)
    yield bouncer
    bouncer.stop()


def _sse_events(port: int, run_id: uuid.UUID) -> list[str]:
    """The event names of the run's SSE stream, read until the server ends it."""
    names: list[str] = []
    with httpx2.stream(
        "GET", f"http://127.0.0.1:{port}/v1/runs/{run_id}/events", timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event:"):
                names.append(line.split(":", 1)[1].strip())
    return names


@pytest.mark.parametrize("listen", ["direct", "polling"])
def test_services_behind_pgbouncer__run_tools_and_answer_waits(
    cluster: Cluster, pgbouncer: PgBouncer, listen: str
):
    pooled = pgbouncer.url(str(conninfo_to_dict(cluster.database_url)["dbname"]))
    cluster.env.update(
        {
            "RUNYARD_DATABASE_URL": pooled,
            "RUNYARD_DATABASE_POOLER": "transaction",
            "RUNYARD_LISTEN_DATABASE_URL": cluster.database_url if listen == "direct" else "",
            "RUNYARD_EVENTS_POLL_SECONDS": "0.5",
        }
    )
    cluster.start_worker("wp", concurrency=2)
    cluster.start_reaper()
    cluster.start_api("api", RUNYARD_QUEUE_ENABLED="true")
    port = cluster.ports["api"]

    answered = []
    for n in range(3):
        # More statements per connection than psycopg's prepare threshold, on every process.
        response = httpx2.post(
            f"http://127.0.0.1:{port}/v1/runs?wait=60",
            json={"tool": "echo", "input": {"n": n}},
            timeout=90,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "succeeded" and body["result"] == {"n": n}
        answered.append(uuid.UUID(body["id"]))
    queued = httpx2.post(
        f"http://127.0.0.1:{port}/v1/runs", json={"tool": "echo", "input": {"n": 9}}, timeout=30
    )
    assert queued.status_code == 202, queued.text
    streamed = uuid.UUID(queued.json()["id"])
    events = _sse_events(port, streamed)
    assert events and events[-1] == "status"
    for run_id in [*answered, streamed]:
        cluster.accepted[run_id] = Expected("succeeded")
    cluster.check_invariants()

    logs = {name: cluster.log_of(name) for name in cluster.procs}
    for name, text in {**logs, "pgbouncer": pgbouncer.log()}.items():
        for error in SESSION_ERRORS:
            assert error not in text, f"{name} logged {error!r}:\n{text[-3000:]}"
    said = "LISTEN on the direct URL" if listen == "direct" else "no LISTEN"
    for name in ("wp", "api"):
        plans = [
            json.loads(line)["message"]
            for line in logs[name].splitlines()
            if "transaction pooler" in line
        ]
        assert len(plans) == 1 and said in plans[0], logs[name][-3000:]
