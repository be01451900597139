"""Migrations: up, down to base, up again, and no drift between models and migrations."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, inspect, text

from runyard.db import alembic_config
from runyard.settings import normalize_database_url

TABLES = {
    "tool_runs",
    "tool_run_jobs",
    "tool_run_events",
    "workers",
    "api_keys",
    "tenant_run_counts",
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
