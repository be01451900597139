"""Migration 0016 against live traffic: it locks ``tenant_run_counts`` and ``tool_runs`` before
anything else, waits out a submit in flight without a deadlock, and gives up with a clear
error when it cannot lock them, having changed nothing."""

from __future__ import annotations

import importlib.util
import threading
import time
from types import ModuleType

import pytest
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Connection, Engine, create_engine, inspect, text

from runyard.platform.db import MIGRATIONS_DIR, alembic_config
from runyard.platform.settings import normalize_database_url

# What a submit does on the schema before 0016: lock its tenant's row 0 of counts (the
# admission), then insert its run (the triggers add it to that row).
ADMISSION = text(
    "INSERT INTO tenant_run_counts AS c (tenant, shard) VALUES (:tenant, 0)"
    " ON CONFLICT (tenant, shard) DO UPDATE SET queued = c.queued"
)
INSERT_RUN = text(
    "INSERT INTO tool_runs (id, tenant, tool, spec, input, status)"
    " VALUES (gen_random_uuid(), :tenant, 'echo', '{}', '{}', 'queued')"
)
A = {"tenant": "a"}


def at_0015(database_url: str) -> tuple[Config, Engine]:
    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.downgrade(config, "0015")
    return config, create_engine(normalize_database_url(database_url))


def wait_for_a_lock_wait(engine: Engine, seconds: float = 10.0) -> None:
    """Until some other session of the database waits for a lock."""
    give_up_at = time.monotonic() + seconds
    with engine.connect() as conn:
        while time.monotonic() < give_up_at:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
            if waiting:
                return
            conn.rollback()
            time.sleep(0.02)
    raise AssertionError("the migration never waited for a lock")


def migration_0016() -> ModuleType:
    path = next((MIGRATIONS_DIR / "versions").glob("0016_*.py"))
    spec = importlib.util.spec_from_file_location("migration_0016", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # holds locks across connections while a migration waits: seconds
def test_0016_upgrade__waits_out_a_submit_in_flight_without_a_deadlock(database_url: str):
    config, engine = at_0015(database_url)
    failed: list[BaseException] = []

    def upgrade() -> None:
        try:
            command.upgrade(config, "0016")
        except BaseException as exc:  # reported by the test
            failed.append(exc)

    migration = threading.Thread(target=upgrade)
    try:
        with engine.connect() as submit:
            with submit.begin():
                submit.execute(ADMISSION, A)
                migration.start()
                wait_for_a_lock_wait(engine)
                # Before, the migration held tool_runs here and waited for the counts: this
                # insert closed the cycle and Postgres aborted one of the two.
                submit.execute(INSERT_RUN, A)
        migration.join(60)
        assert not migration.is_alive()
        assert failed == []
        with engine.connect() as conn:
            stored = conn.execute(
                text("SELECT sum(stored) FROM tenant_run_counts WHERE tenant = 'a'")
            ).scalar_one()
        assert stored == 1  # the submit's run, counted by the backfill
        command.upgrade(config, "head")
    finally:
        migration.join(60)
        engine.dispose()


@pytest.mark.slow  # sits out a lock timeout
def test_0016_upgrade__gives_up_with_a_clear_error_and_changes_nothing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
):
    config, engine = at_0015(database_url)
    module = migration_0016()
    monkeypatch.setattr(module, "LOCK_GIVE_UP_SECONDS", 3.0)
    monkeypatch.setattr(module, "LOCK_PAUSE_SECONDS", 0.1)

    def lock(conn: Connection) -> None:
        with Operations.context(MigrationContext.configure(conn)):
            module.lock_counts_and_runs()

    written = threading.Event()

    def submit_meanwhile() -> None:
        """Another tenant's submit while the migration tries."""
        time.sleep(0.3)
        with engine.begin() as conn:
            conn.execute(ADMISSION, {"tenant": "b"})
            conn.execute(INSERT_RUN, {"tenant": "b"})
        written.set()

    other = threading.Thread(target=submit_meanwhile)
    try:
        with engine.connect() as busy, engine.connect() as migrating:
            with busy.begin():
                busy.execute(ADMISSION, A)  # a transaction that holds the counts throughout
                other.start()
                with migrating.begin():
                    with pytest.raises(module.LocksUnavailable) as gave_up:
                        lock(migrating)
                # The other submit went through while it tried: it never kept a lock that
                # submits wait for.
                submitted_meanwhile = written.is_set()
        other.join(30)
        columns = {c["name"] for c in inspect(engine).get_columns("tenant_run_counts")}
        command.upgrade(config, "head")
    finally:
        other.join(30)
        engine.dispose()
    assert submitted_meanwhile
    message = str(gave_up.value)
    assert "could not lock tenant_run_counts and tool_runs in 3 s" in message
    assert "nothing was changed" in message
    assert columns == {"tenant", "shard", "queued", "running"}
