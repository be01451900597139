"""Alembic environment: target metadata is ``runyard.platform.models``; URL from config or env."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import engine_from_config, pool

from runyard.platform.models import Base
from runyard.platform.settings import normalize_database_url

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("RUNYARD_DATABASE_URL", "")
    return normalize_database_url(url)


def run_migrations_offline() -> None:
    """Emit SQL without a connection (``alembic upgrade --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a live connection."""
    section = config.get_section(config.config_ini_section, {})
    section["sqlalchemy.url"] = _url()
    connectable = engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
