"""The schema revision the API expects is the packaged migrations' head."""

from __future__ import annotations

from runyard.platform.schema_version import MIGRATION_HEADS, script_heads


def test_migration_heads__are_the_heads_alembic_reads_from_the_migrations():
    assert script_heads() == MIGRATION_HEADS, (
        "runyard.platform.schema_version.MIGRATION_HEADS must name the newest migration"
    )
