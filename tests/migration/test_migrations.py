"""Migrations: up, down to base, up again, and no drift between models and migrations."""

from __future__ import annotations

import uuid

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, inspect, text

from runyard.platform.db import alembic_config
from runyard.platform.settings import normalize_database_url
from runyard.reads.runs import RunReader

TABLES = {
    "tool_runs",
    "tool_run_jobs",
    "tool_run_events",
    "workers",
    "api_keys",
    "tenant_run_counts",
    "tenant_settings",
    "webhook_deliveries",
    "webhook_destinations",
    "batches",
    "tool_run_deps",
    "run_artifacts",
    "sandboxes",
    "sandbox_execs",
    "sandbox_exec_chunks",
    "run_artifact_chunks",
    "tool_build_contexts",
    "tool_builds",
    "deleted_runs",
    "schedules",
    "flow_counters",
    "attempt_usage",
    "build_usage",
    "tenant_usage_totals",
    "tenant_usage_days",
}


def _tables(url: str) -> set[str]:
    engine = create_engine(normalize_database_url(url))
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _downgraded(database_url: str, revision: str) -> tuple[Config, Engine]:
    """The test's database taken down to ``revision``, and an engine on it."""
    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.downgrade(config, revision)
    return config, create_engine(normalize_database_url(database_url))


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
    assert "ix_tool_run_jobs_lease_expiry" in indexes
    # No index leads with status: fenced writes take the primary key.
    assert all(ix["column_names"][0] != "status" for ix in indexes.values())


@pytest.mark.slow  # walks the migrations down and back up with data: seconds
def test_tenant_run_counts__backfilled_from_the_runs_already_there(database_url: str):
    config, engine = _downgraded(database_url, "0005")
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
                    "SELECT tenant, sum(queued), sum(running), sum(stored) FROM tenant_run_counts "
                    "GROUP BY tenant ORDER BY tenant"
                )
            ).all()
    finally:
        engine.dispose()
    # Queued and running runs (migration 0006), and every run kept (migration 0016).
    assert [tuple(row) for row in rows] == [("a", 2, 1, 4), ("b", 0, 1, 1), ("c", 0, 0, 1)]


def test_event_xact_id__rows_from_before_keep_their_order_and_ids_still_resume(database_url: str):
    config, engine = _downgraded(database_url, "0006")
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


@pytest.mark.slow  # walks the migrations down and back up with data: seconds
def test_sync_runs_are_jobs__runs_in_flight_become_adoptable_jobs_and_come_back(
    database_url: str,
):
    config, engine = _downgraded(database_url, "0007")
    running, queued, done = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    """
                    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode,
                                           started_at, attempts, sync_owner, sync_owner_until)
                    VALUES (:running, 'a', 'echo', '{"timeout_seconds": 30}', '{}',
                            'running', 'sync', now(), 1, 'api-1', now()),
                           (:queued, 'a', 'echo', '{"timeout_seconds": 30}', '{}',
                            'queued', 'sync', NULL, 0, 'api-1', now()),
                           (:done, 'a', 'echo', '{"timeout_seconds": 30}', '{}',
                            'succeeded', 'sync', now(), 1, 'api-1', NULL)
                    """
                ),
                {"running": running, "queued": queued, "done": done},
            )
            conn.execute(
                text(
                    "INSERT INTO tool_run_events (run_id, type, data) VALUES "
                    '(:id, \'claimed\', \'{"attempt": 1, "engine_id": "engine-a"}\')'
                ),
                {"id": running},
            )
        command.upgrade(config, "head")
        with engine.connect() as conn:
            jobs = conn.execute(
                text(
                    "SELECT run_id, CAST(status AS text) AS status, queue, engine_id,"
                    " lease_token, locked_until, attempts, max_attempts,"
                    " container_requested_at IS NOT NULL AS requested,"
                    " deadline_at - started_at AS timeout FROM tool_run_jobs"
                )
            ).all()
            lost = conn.execute(
                text("SELECT CAST(status AS text), error_code FROM tool_runs WHERE id = :id"),
                {"id": queued},
            ).one()
            counts = conn.execute(
                text("SELECT sum(queued), sum(running) FROM tenant_run_counts WHERE tenant = 'a'")
            ).one()
        columns = {c["name"] for c in inspect(engine).get_columns("tool_runs")}
        command.downgrade(config, "0007")
        with engine.connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM tool_run_jobs")).scalar_one()
            owner = conn.execute(
                text("SELECT sync_owner, sync_owner_until <= now() FROM tool_runs WHERE id = :id"),
                {"id": running},
            ).one()
        command.upgrade(config, "head")
    finally:
        engine.dispose()
    assert [tuple(j)[:9] for j in jobs] == [
        (running, "running", "sync", "engine-a", None, None, 1, 1, True)
    ]
    assert jobs[0].timeout.total_seconds() == 30
    assert tuple(lost) == ("failed", "api_lost")
    assert tuple(counts) == (0, 1)
    assert not {"sync_owner", "sync_owner_until"} & columns
    assert left == 0 and tuple(owner) == ("migration", True)


@pytest.mark.slow  # walks the migrations down and back up with data: seconds
def test_artifacts__rows_go_with_their_run_chunks_are_uncompressed_and_come_back_empty(
    database_url: str,
):
    config, engine = _downgraded(database_url, "0011")
    run_id, set_id = uuid.uuid4(), uuid.uuid4()
    try:
        assert "run_artifacts" not in inspect(engine).get_table_names()
        command.upgrade(config, "head")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tool_runs (id, tenant, tool, spec, input, status, artifact_set)"
                    " VALUES (:id, 'a', 'echo', '{}', '{}', 'succeeded', :set)"
                ),
                {"id": run_id, "set": set_id},
            )
            for insert in (
                "INSERT INTO run_artifacts VALUES (:id, :set, 'f', 3, 'abc', 1048576)",
                "INSERT INTO run_artifact_chunks VALUES (:id, :set, 'f', 0, 'xyz')",
            ):
                conn.execute(text(insert), {"id": run_id, "set": set_id})
            storage = conn.execute(
                text(
                    "SELECT attstorage FROM pg_attribute"
                    " WHERE attrelid = 'run_artifact_chunks'::regclass AND attname = 'data'"
                )
            ).scalar_one()
            conn.execute(text("DELETE FROM tool_runs WHERE id = :id"), {"id": run_id})
            left = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM run_artifacts)"
                    " + (SELECT count(*) FROM run_artifact_chunks)"
                )
            ).scalar_one()
        command.downgrade(config, "0011")
        columns = {c["name"] for c in inspect(engine).get_columns("tool_runs")}
        command.upgrade(config, "head")
    finally:
        engine.dispose()
    assert storage == "e"
    assert left == 0
    assert "artifact_set" not in columns


def _event_trigger(engine: Engine) -> tuple[str, str]:
    """The notify trigger on tool_run_events: (function, row or statement)."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT p.proname, CASE WHEN t.tgtype & 1 = 1 THEN 'row' ELSE 'statement' END"
                " FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
                " WHERE t.tgrelid = 'tool_run_events'::regclass"
                " AND t.tgname = 'tool_run_events_notify'"
            )
        ).one()
    return str(row[0]), str(row[1])


@pytest.mark.slow  # walks the migrations down and back up with data: seconds
def test_event_notify_per_statement__replaces_the_row_trigger_and_comes_back(database_url: str):
    config, engine = _downgraded(database_url, "0014")
    try:
        before = _event_trigger(engine)
        command.upgrade(config, "head")
        after = _event_trigger(engine)
        command.downgrade(config, "0014")
        again = _event_trigger(engine)
        command.upgrade(config, "head")
    finally:
        engine.dispose()
    assert before == again == ("runyard_notify_event", "row")
    assert after == ("runyard_notify_events", "statement")


@pytest.mark.slow  # walks the migrations down and back up with data: seconds
def test_created_and_stored_counts__come_with_the_rerun_of_index_and_go_back(database_url: str):
    config, engine = _downgraded(database_url, "0015")
    insert = text(
        "INSERT INTO tool_runs (id, tenant, tool, spec, input, status)"
        " VALUES (gen_random_uuid(), 'a', 'echo', '{}', '{}', 'failed')"
    )
    try:
        before = {c["name"] for c in inspect(engine).get_columns("tenant_run_counts")}
        with engine.begin() as conn:
            conn.execute(insert)  # terminal: migration 0006's trigger does not count it
        command.upgrade(config, "head")
        with engine.begin() as conn:
            conn.execute(insert)  # counted now: created in the window, and stored
            counts = conn.execute(
                text(
                    "SELECT sum(stored), sum(window_created) FROM tenant_run_counts"
                    " WHERE tenant = 'a'"
                )
            ).one()
        indexes = {ix["name"] for ix in inspect(engine).get_indexes("tool_runs")}
        command.downgrade(config, "0015")
        with engine.begin() as conn:
            conn.execute(insert)  # the old trigger again
        after = {c["name"] for c in inspect(engine).get_columns("tenant_run_counts")}
        gone = {ix["name"] for ix in inspect(engine).get_indexes("tool_runs")}
        command.upgrade(config, "head")
    finally:
        engine.dispose()
    assert before == after == {"tenant", "shard", "queued", "running"}
    assert tuple(counts) == (2, 1)  # both runs kept (the backfill), one made since
    assert "ix_tool_runs_rerun_of" in indexes and "ix_tool_runs_rerun_of" not in gone


def test_webhook_breakers__start_closed_and_each_tenants_own_after_0019(database_url: str):
    config, engine = _downgraded(database_url, "0018")
    insert = (
        "INSERT INTO webhook_destinations (destination, failures, open_until, updated_at) "
        "VALUES ('hooks.example:443', 7, now() + interval '1 hour', now())"
    )
    try:
        with engine.begin() as conn:
            conn.execute(text(insert))
        command.upgrade(config, "head")
        with engine.begin() as conn:
            left = conn.execute(text("SELECT count(*) FROM webhook_destinations")).scalar_one()
            for tenant in ("a", "b"):  # one destination, a breaker for each tenant
                conn.execute(
                    text(
                        "INSERT INTO webhook_destinations "
                        "(tenant, destination, failures, updated_at) "
                        "VALUES (:tenant, 'hooks.example:443', 1, now())"
                    ),
                    {"tenant": tenant},
                )
        command.downgrade(config, "0018")
        with engine.begin() as conn:
            after_down = conn.execute(
                text("SELECT count(*) FROM webhook_destinations")
            ).scalar_one()
            conn.execute(text(insert))  # keyed by destination alone again
        command.upgrade(config, "head")
    finally:
        engine.dispose()
    assert (left, after_down) == (0, 0)
