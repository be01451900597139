"""Tool isolation with real processes: secrets never stored, logged or answered; a worker
refuses an engine that lacks a tool's runtime or network."""

from __future__ import annotations

import logging
import signal
import uuid
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql

from api.main import create_app
from runyard.platform.settings import Settings
from runyard.registry.tools import load_registry
from runyard.tenancy.auth import create_api_key
from tests.acceptance.cluster import TERMINAL, Cluster, Expected

pytestmark = pytest.mark.docker

SECRET = "accept-" + uuid.uuid4().hex
FILE_SECRET = "acceptfile-" + uuid.uuid4().hex
# Prints both secrets to stdout and stderr, runs past the live-log start, returns one.
LEAKY = """
[tools.leaky]
image = "runyard/toolbox:latest"
command = ["sh", "-c", '''
echo "token=$TOKEN"
echo "cert=$CERT" >&2
sleep 1.5
echo "late $TOKEN"
printf '{"t": "%s"}' "$TOKEN" > /runyard/out/result.json
''']
timeout_seconds = 30
memory_mb = 32
secrets = { TOKEN = "env:RY_ACCEPT_TOKEN", CERT = "file:CERT_PATH" }
"""


def _dump(database_url: str) -> bytes:
    """Every row of every table of the test's database, as COPY writes it."""
    out = bytearray()
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables"
            " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
        assert ("public", "tool_runs") in tables
        for schema, table in tables:
            query = sql.SQL("COPY {}.{} TO STDOUT").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            with conn.cursor().copy(query) as copy:
                for block in copy:
                    out += bytes(block)
    return bytes(out)


def test_secrets__never_reach_the_database_the_logs_or_an_answer(
    cluster: Cluster,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.DEBUG)
    cert = tmp_path / "cert"
    cert.write_text(FILE_SECRET + "\n")
    tools = tmp_path / "tools.toml"
    tools.write_text(LEAKY.replace("CERT_PATH", str(cert)))
    cluster.registry = load_registry(tools, Settings(database_url="unused"))
    cluster.env.update(
        {
            "RUNYARD_TOOLS_FILE": str(tools),
            "RY_ACCEPT_TOKEN": SECRET,
            "RUNYARD_LOG_LEVEL": "DEBUG",
        }
    )
    # The sync-mode API creates containers too: it reads the secrets from its own env.
    monkeypatch.setenv("RY_ACCEPT_TOKEN", SECRET)
    key = create_api_key(cluster.engine, "acme")
    headers = {"Authorization": f"Bearer {key}"}
    settings = Settings(database_url=database_url, tools_file=tools)
    with TestClient(create_app(settings)) as api:
        queued = api.post("/v1/runs", json={"tool": "leaky", "input": {}}, headers=headers)
        assert queued.status_code == 202, queued.text
        run_id = uuid.UUID(queued.json()["id"])
        cluster.accepted[run_id] = Expected(status="succeeded")
        cluster.start_worker("w1")
        cluster.wait_for(lambda: cluster.status(run_id) in TERMINAL, 60, "the run to end")
        answers = [
            api.get(f"/v1/runs/{run_id}", headers=headers).text,
            api.get(f"/v1/runs/{run_id}/logs", headers=headers).text,
            api.get(f"/v1/runs/{run_id}/events", headers=headers).text,
        ]
    cluster.signal("w1", signal.SIGTERM)
    assert cluster.wait_exit("w1") == 0
    assert cluster.status(run_id) == "succeeded", cluster.diagnostics()
    assert "token=***" in answers[1] and "cert=***" in answers[1] and "late ***" in answers[1]
    assert '"t":"***"' in answers[0].replace(" ", "")

    sync_settings = Settings(database_url=database_url, tools_file=tools, queue_enabled=False)
    with TestClient(create_app(sync_settings)) as api:
        inline = api.post("/v1/runs", json={"tool": "leaky", "input": {}}, headers=headers)
        assert inline.status_code == 200, inline.text
        assert inline.json()["result"] == {"t": "***"}
        sync_id = inline.json()["id"]
        answers.append(inline.text)
        answers.append(api.get(f"/v1/runs/{sync_id}/logs", headers=headers).text)
        answers.append(api.get(f"/v1/runs/{sync_id}/events", headers=headers).text)
    assert "token=***" in answers[-2]

    dump = _dump(database_url)
    assert str(run_id).encode() in dump and b"token=***" in dump  # the dump has the runs
    worker_log = cluster.log_of("w1")
    assert "worker started" in worker_log
    for value in (SECRET, FILE_SECRET):
        assert value.encode() not in dump
        assert value not in worker_log
        assert value not in caplog.text
        for answer in answers:
            assert value not in answer


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('runtime = "runyard-no-such-runtime"', "runtime 'runyard-no-such-runtime' is not one"),
        ('network = "runyard-no-such-net"', "the engine has no network 'runyard-no-such-net'"),
        ('network = "host"', "network 'host' must be 'none', 'bridge' or the name of"),
    ],
    ids=["runtime", "network", "network-name"],
)
def test_worker_start__refuses_what_the_engine_or_docker_cannot_give(
    cluster: Cluster, tmp_path: Path, entry: str, message: str
):
    tools = tmp_path / "tools.toml"
    tools.write_text(f'[tools.t]\nimage = "runyard/toolbox:latest"\ncommand = ["true"]\n{entry}\n')
    cluster.env["RUNYARD_TOOLS_FILE"] = str(tools)
    cluster.start_worker("w1")
    assert cluster.wait_exit("w1", timeout=30) == 2
    log = cluster.log_of("w1")
    assert "cannot start" in log and message in log
