"""Migration 0020: a sandbox's rows go with its run, and the downgrade takes its tables."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, inspect, text

from runyard.platform.db import alembic_config
from runyard.platform.settings import Settings
from runyard.queue import AdmissionCaps, ApiQueue
from runyard.registry.tools import load_registry
from runyard.sandboxes.create import Sandboxes, SandboxRequest
from runyard.sandboxes.store import NewExec, SandboxStore

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_TABLES = {"sandboxes", "sandbox_execs", "sandbox_exec_chunks"}


def test_sandbox_rows__go_with_their_run_and_the_downgrade_takes_the_tables(
    database_url: str, engine: Engine
):
    registry = load_registry(ROOT / "tests" / "tools.toml", Settings(database_url="unused"))
    store = SandboxStore(engine)
    uses = Sandboxes(ApiQueue(engine), registry, AdmissionCaps(), store, output_cap=1024)
    run_id = uses.create(SandboxRequest(tenant="acme", tool="sandbox"))
    exec_id = store.insert_exec(run_id, NewExec(["true"], b"in", {}, "/", 5))
    assert exec_id is not None and store.mark_running(exec_id) is not None
    assert store.append(exec_id, "stdout", 0, 2, b"ok")

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM tool_runs WHERE id = :id"), {"id": run_id})
        left = [
            conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in sorted(SANDBOX_TABLES)
        ]
    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.downgrade(config, "0019")
    tables = set(inspect(engine).get_table_names())
    command.upgrade(config, "head")

    assert left == [0, 0, 0]
    assert not tables & SANDBOX_TABLES
    assert SANDBOX_TABLES <= set(inspect(engine).get_table_names())
