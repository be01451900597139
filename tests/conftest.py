"""Shared fixtures: a real Postgres (testcontainers or RUNYARD_TEST_DATABASE_URL), one
migrated template database, and a fresh database cloned from it for every test."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from runyard.platform.db import make_engine, migrate

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
    # Loopback connections are trusted: the suite opens thousands, and a password exchange
    # (SCRAM) cost each about 5.6 ms of the client's CPU and 2.2 ms of the server's. The URLs
    # still carry the password, as a deployment's do.
    container.with_env("POSTGRES_HOST_AUTH_METHOD", "trust")
    # The data directory in memory: every test clones the template into a database of its
    # own and drops it after, which on the engine's disk took about 350 ms a test (16 ms in
    # memory). In memory the clone copies the template's files (see ``database_url``).
    container.with_tmpfs_mount("/var/lib/postgresql/data")
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


class _ServerAdmin:
    """One autocommit connection to the server's own database for the test databases'
    CREATE and DROP (a connection a test saved two connects), made again if it was cut."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[Any] | None = None

    def execute(self, statement: sql.Composed) -> None:
        """Run ``statement``; once more on a new connection if the old one was cut."""
        for last in (False, True):
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._url, autocommit=True)
            try:
                self._conn.execute(statement)
                return
            except psycopg.OperationalError:
                self._conn.close()
                self._conn = None
                if last:
                    raise

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()


@pytest.fixture(scope="session")
def server_admin(postgres_server_url: str) -> Iterator[_ServerAdmin]:
    """The connection that makes and drops the test databases."""
    admin = _ServerAdmin(postgres_server_url)
    yield admin
    admin.close()


@pytest.fixture
def database_url(
    postgres_server_url: str, template_database: str, server_admin: _ServerAdmin
) -> Iterator[str]:
    """URL of a fresh, migrated database of this test's own, dropped afterwards.

    Made and dropped in the test's own time, never beside it: a CREATE or DROP DATABASE holds
    a transaction open, which holds back the server-wide horizon that event readers stop at.
    """
    name = f"t_{uuid.uuid4().hex[:16]}"
    # On our own server, FILE_COPY, not the default WAL_LOG: the server copies the
    # template's files after a checkpoint (cheap with the data directory in memory and fsync
    # off) instead of writing its every block through the WAL. A clone and its drop took 30 ms
    # of the server's CPU instead of 52-63 ms. A server of the caller's keeps its default.
    strategy = "" if os.environ.get("RUNYARD_TEST_DATABASE_URL") else " STRATEGY FILE_COPY"
    server_admin.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE {}" + strategy).format(
            sql.Identifier(name), sql.Identifier(template_database)
        )
    )
    url = _libpq_url(postgres_server_url, name)
    yield url
    _record_runs_of(url)
    server_admin.execute(
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


def _record_runs_of(url: str) -> None:
    """Record the runs of a test's database: processes the test started may have made
    containers for them."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            record_run_ids(r for (r,) in conn.execute("SELECT id FROM tool_runs"))
    except psycopg.Error:
        pass  # a migration test may have left no runs table


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A pooled engine on this test's database."""
    eng = make_engine(database_url, pool_size=20, max_overflow=20)
    yield eng
    eng.dispose()


# Every run id this suite may have made a container for, one file per process: the leftover
# check below judges only those, never the whole engine (a dev stack, a benchmark or another
# checkout's suite may run on the same engine meanwhile).
_RECORD_DIR_ENV = "RUNYARD_TEST_RUN_RECORD_DIR"


def record_run_ids(run_ids: Iterable[object]) -> None:
    """Remember run ids this test session made containers (or rows) for."""
    directory = os.environ.get(_RECORD_DIR_ENV)
    ids = [str(r) for r in run_ids]
    if directory and ids:
        with open(Path(directory) / f"{os.getpid()}.ids", "a", encoding="utf-8") as out:
            out.write("".join(f"{r}\n" for r in ids))


def _recorded_run_ids() -> set[str]:
    directory = os.environ.get(_RECORD_DIR_ENV)
    if not directory:
        return set()
    ids: set[str] = set()
    for path in Path(directory).glob("*.ids"):
        ids.update(path.read_text(encoding="utf-8").split())
    return ids


def _record_created_containers() -> None:
    """Record the run id of every labelled container this process creates (the in-process
    runners of the integration tests; processes a test starts are covered by its database)."""
    import docker.api.client

    create = docker.api.client.APIClient.create_container
    if getattr(create, "records_run_ids", False):
        return

    def recording_create(self: Any, *args: Any, **kwargs: Any) -> Any:
        run_id = (kwargs.get("labels") or {}).get("io.runyard.run_id")
        if run_id:
            record_run_ids([run_id])
        return create(self, *args, **kwargs)

    recording_create.records_run_ids = True  # type: ignore[attr-defined]
    docker.api.client.APIClient.create_container = recording_create


def _managed_docker_objects() -> dict[str, str] | None:
    """Every labelled runyard container and volume on the engine, with its run id."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        label = {"label": "io.runyard.managed=true"}
        objects = {
            f"container:{c['Names'][0].lstrip('/')}": (c.get("Labels") or {}).get(_RUN_LABEL, "")
            for c in client.api.containers(all=True, filters=label)
        }
        volumes = client.api.volumes(filters=label).get("Volumes") or []
        objects |= {
            f"volume:{v['Name']}": (v.get("Labels") or {}).get(_RUN_LABEL, "") for v in volumes
        }
        client.close()
    except Exception:
        return None
    objects.pop("volume:runyard-engine-marker", None)
    return objects


def _is_xdist_worker(config: pytest.Config) -> bool:
    # Under pytest-xdist (scripts/test --quick) only the controller sees the whole suite.
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """The controller makes the run-id record that every test process appends to."""
    if not _is_xdist_worker(config) and _RECORD_DIR_ENV not in os.environ:
        os.environ[_RECORD_DIR_ENV] = tempfile.mkdtemp(prefix="runyard-test-runs-")
    _record_created_containers()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Remember which runyard containers and volumes existed before the suite."""
    if _is_xdist_worker(session.config):
        return
    session.config.stash[_BEFORE] = _managed_docker_objects()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite must leave no container or volume of its own runs behind."""
    if _is_xdist_worker(session.config):
        return
    before = session.config.stash.get(_BEFORE, None)
    after = _managed_docker_objects()
    if before is None or after is None:
        return
    leftover = sorted(suite_leftovers(before, after, _recorded_run_ids()))
    if leftover:
        session.config.get_terminal_writer().line(
            f"runyard containers/volumes left over by the suite: {leftover}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def suite_leftovers(
    before: dict[str, str], after: dict[str, str], suite_runs: set[str]
) -> set[str]:
    """The objects that appeared during the suite and belong to one of its own runs."""
    return {name for name, run in after.items() if name not in before and run in suite_runs}


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller removes the record."""
    directory = os.environ.get(_RECORD_DIR_ENV)
    if directory and not _is_xdist_worker(config):
        shutil.rmtree(directory, ignore_errors=True)


_RUN_LABEL = "io.runyard.run_id"
_BEFORE = pytest.StashKey[dict[str, str] | None]()
