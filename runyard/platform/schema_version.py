"""Which schema revision the code expects and which one a database is at (for readiness)."""

from __future__ import annotations

from sqlalchemy import Engine, text

from runyard.platform.db import MIGRATIONS_DIR

# The head revision(s) of the packaged migrations, written out: reading them with Alembic
# cost each API start about 0.2 s of CPU (its import). A test checks that they are Alembic's
# heads, so a new migration cannot be left out here.
MIGRATION_HEADS = frozenset({"0028"})

DATABASE_REVISIONS = text("SELECT version_num FROM alembic_version")


def script_heads() -> frozenset[str]:
    """The head revision(s) of the packaged migrations, as Alembic reads them."""
    # Imported here: only the check of MIGRATION_HEADS and the tools that migrate need it.
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return frozenset(ScriptDirectory.from_config(config).get_heads())


def database_revisions(engine: Engine) -> frozenset[str]:
    """The revision(s) the database is stamped with (empty if it was never migrated)."""
    with engine.connect() as conn:
        return frozenset(str(row) for row in conn.execute(DATABASE_REVISIONS).scalars())
