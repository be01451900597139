"""Shared fixtures: a real Postgres (testcontainers or RUNYARD_TEST_DATABASE_URL), one
migrated template database, and a fresh database cloned from it for every test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from runyard.db import make_engine, migrate

# Ryuk (testcontainers' reaper) is an image that cannot be pulled where no registry answers;
# the fixtures below stop what they start instead.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
# Inside a container (/.dockerenv) testcontainers would reach Postgres through the bridge
# gateway; tests talk to loopback only, through the published port.
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
os.environ.setdefault("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")

TEMPLATE_DB = f"runyard_template_{os.getpid()}"


def _libpq_url(url: str, database: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """Admin URL of a Postgres server for the whole session."""
    configured = os.environ.get("RUNYARD_TEST_DATABASE_URL")
    if configured:
        yield _libpq_url(configured)
        return
    from testcontainers.community.postgres import PostgresContainer

    image = os.environ.get("RUNYARD_TEST_POSTGRES_IMAGE", "postgres:16-alpine")
    container = PostgresContainer(image, username="runyard", password="runyard", dbname="postgres")
    container.with_command("postgres -c max_connections=300 -c fsync=off")
    container.start()
    try:
        url = _libpq_url(container.get_connection_url(driver=None))
        # Tests never send traffic anywhere but this machine's loopback.
        assert make_url(url).host in ("127.0.0.1", "localhost", "::1"), url
        yield url
    finally:
        container.stop()


@pytest.fixture(scope="session")
def template_database(postgres_server_url: str) -> Iterator[str]:
    """A database migrated to head once; each test clones it."""
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE_DB))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
    migrate(_libpq_url(postgres_server_url, TEMPLATE_DB))
    yield TEMPLATE_DB
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE_DB))
        )


@pytest.fixture
def database_url(postgres_server_url: str, template_database: str) -> Iterator[str]:
    """URL of a fresh, migrated database of this test's own, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_database)
            )
        )
    yield _libpq_url(postgres_server_url, name)
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A pooled engine on this test's database."""
    eng = make_engine(database_url, pool_size=20, max_overflow=20)
    yield eng
    eng.dispose()


def _managed_docker_objects() -> set[str] | None:
    try:
        import docker

        client = docker.from_env(timeout=10)
        label = {"label": "io.runyard.managed=true"}
        names = {f"container:{c.name}" for c in client.containers.list(all=True, filters=label)}
        names |= {f"volume:{v.name}" for v in client.volumes.list(filters=label)}
        client.close()
    except Exception:
        return None
    return names - {"volume:runyard-engine-marker"}


def _is_xdist_worker(config: pytest.Config) -> bool:
    # Under pytest-xdist (scripts/test --quick) only the controller sees the whole suite.
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Remember which runyard containers and volumes existed before the suite."""
    if _is_xdist_worker(session.config):
        return
    session.config.stash[_BEFORE] = _managed_docker_objects()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite must leave no labelled container or volume behind."""
    if _is_xdist_worker(session.config):
        return
    before = session.config.stash.get(_BEFORE, None)
    after = _managed_docker_objects()
    if before is None or after is None:
        return
    leftover = sorted(after - before)
    if leftover:
        session.config.get_terminal_writer().line(
            f"runyard containers/volumes left over by the suite: {leftover}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set[str] | None]()
