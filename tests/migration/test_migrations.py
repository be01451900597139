"""Migrations: up, down to base, up again, and no drift between models and migrations."""

from __future__ import annotations

import uuid

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, inspect, text

from runyard.db import alembic_config
from runyard.runs import RunReader
from runyard.settings import normalize_database_url

TABLES = {
    "tool_runs",
    "tool_run_jobs",
    "tool_run_events",
    "workers",
    "api_keys",
    "tenant_run_counts",
    "tenant_settings",
    "webhook_deliveries",
}


def _tables(url: str) -> set[str]:
    engine = create_engine(normalize_database_url(url))
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade__round_trips(database_url: str):
    config = alembic_config(database_url)
    assert isinstance(config, Config)
    assert _tables(database_url) == TABLES  # the template was migrated to head
    command.downgrade(config, "base")
    assert _tables(database_url) == set()
    command.upgrade(config, "head")
    assert _tables(database_url) == TABLES


def test_models_and_migrations__do_not_drift(database_url: str):
    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.check(config)  # raises if autogenerate would emit any operation


def test_adoptable_partial_index__exists(database_url: str):
    engine = create_engine(normalize_database_url(database_url))
    try:
        indexes = {ix["name"]: ix for ix in inspect(engine).get_indexes("tool_run_jobs")}
    finally:
        engine.dispose()
    assert "ix_tool_run_jobs_adoptable" in indexes
    assert "ix_tool_run_jobs_status_available_priority" in indexes
    assert "ix_tool_run_jobs_status_locked_until" in indexes


def test_tenant_run_counts__backfilled_from_the_runs_already_there(database_url: str):
    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.downgrade(config, "0005")
    engine = create_engine(normalize_database_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    """
                    INSERT INTO tool_runs (id, tenant, tool, spec, input, status)
                    SELECT gen_random_uuid(), t, 'echo', '{}', '{}', CAST(s AS run_status)
                    FROM (VALUES ('a', 'queued'), ('a', 'queued'), ('a', 'running'),
                                 ('a', 'succeeded'), ('b', 'running'), ('c', 'failed')) v(t, s)
                    """
                )
            )
        command.upgrade(config, "head")
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT tenant, sum(queued), sum(running) FROM tenant_run_counts "
                    "GROUP BY tenant ORDER BY tenant"
                )
            ).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in rows] == [("a", 2, 1), ("b", 0, 1)]


def test_event_xact_id__rows_from_before_keep_their_order_and_ids_still_resume(database_url: str):
    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.downgrade(config, "0006")
    engine = create_engine(normalize_database_url(database_url))
    insert = text(
        "INSERT INTO tool_run_events (run_id, type, data) "
        "VALUES (:run_id, 'stdout', CAST(:data AS jsonb)) RETURNING id"
    )
    try:
        run_id = uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tool_runs (id, tenant, tool, spec, input, status) "
                    "VALUES (:id, 'a', 'echo', '{}', '{}', 'running')"
                ),
                {"id": run_id},
            )
            old = [
                conn.execute(insert, {"run_id": run_id, "data": f'{{"text": "{n}"}}'}).scalar_one()
                for n in range(3)
            ]
        command.upgrade(config, "head")
        with engine.begin() as conn:
            new = conn.execute(insert, {"run_id": run_id, "data": '{"text": "new"}'}).scalar_one()
        with engine.connect() as conn:
            xact_ids = conn.execute(
                text("SELECT xact_id FROM tool_run_events WHERE run_id = :id ORDER BY id"),
                {"id": run_id},
            ).scalars()
            assert list(xact_ids)[:3] == [0, 0, 0]
        indexes = {ix["name"] for ix in inspect(engine).get_indexes("tool_run_events")}
        page = RunReader(engine).status_and_events(run_id, after_id=old[0])
    finally:
        engine.dispose()
    assert indexes == {"ix_tool_run_events_run_id_xact_id_id"}
    assert [e.id for e in page.events] == [old[1], old[2], new]
