"""Engine construction and the migration entry point; nothing is connected at import."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine

from runyard.settings import normalize_database_url

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(database_url: str, *, pool_size: int = 5, max_overflow: int = 10) -> Engine:
    """A pooled psycopg 3 engine; connections are checked before use so restarts heal."""
    return create_engine(
        normalize_database_url(database_url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        pool_recycle=1800,
    )


def alembic_config(database_url: str) -> object:
    """An Alembic ``Config`` pointing at the packaged migrations and the given database."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", normalize_database_url(database_url))
    return config


def migrate(database_url: str, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` (``alembic upgrade head``)."""
    from alembic import command
    from alembic.config import Config

    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.upgrade(config, revision)
