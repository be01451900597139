"""Which schema revision the code expects and which one a database is at (for readiness)."""

from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from runyard.platform.db import MIGRATIONS_DIR

DATABASE_REVISIONS = text("SELECT version_num FROM alembic_version")


def script_heads() -> frozenset[str]:
    """The head revision(s) of the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return frozenset(ScriptDirectory.from_config(config).get_heads())


def database_revisions(engine: Engine) -> frozenset[str]:
    """The revision(s) the database is stamped with (empty if it was never migrated)."""
    with engine.connect() as conn:
        return frozenset(str(row) for row in conn.execute(DATABASE_REVISIONS).scalars())
