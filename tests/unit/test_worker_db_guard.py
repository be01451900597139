"""The worker's connection settings: timeouts and keepalives, the operator's own kept."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from runyard.settings import Settings
from worker.db_guard import guarded_url
from worker.service import WorkerConfig


def test_guarded_url__adds_timeouts_and_keepalives():
    url = make_url(guarded_url("postgres://u:p@db:5432/x", statement_timeout=30))
    assert url.drivername == "postgresql+psycopg" and url.password == "p"
    assert url.query["options"] == "-c statement_timeout=30000"
    assert url.query["connect_timeout"] == "10"
    assert url.query["keepalives"] == "1"
    assert url.query["tcp_user_timeout"] == "35000"


def test_guarded_url__the_operators_settings_win():
    url = make_url(
        guarded_url(
            "postgresql://db/x?connect_timeout=3&options=-c%20statement_timeout%3D9",
            statement_timeout=0.5,
            connect_timeout=0.5,
        )
    )
    assert url.query["connect_timeout"] == "3"
    # libpq applies -c settings in order: the operator's, last, wins.
    assert url.query["options"] == "-c statement_timeout=500 -c statement_timeout=9"


def test_guarded_url__no_statement_timeout_and_a_two_second_connect_floor():
    url = make_url(guarded_url("postgresql://db/x", statement_timeout=0, connect_timeout=0.2))
    assert "options" not in url.query
    assert url.query["connect_timeout"] == "2"


@pytest.mark.parametrize(
    ("lease", "heartbeat", "timeout", "expected"),
    [
        (30, None, None, 5.0),  # min(10, 20) / 2
        (3, 1, None, 0.5),
        (30, 20, None, 5.0),  # min(20, 10) / 2
        (30, None, 2, 2.0),
    ],
)
def test_settings__heartbeat_round_timeout(lease, heartbeat, timeout, expected):
    settings = Settings(
        database_url="x",
        lease_seconds=lease,
        heartbeat_seconds=heartbeat,
        heartbeat_timeout_seconds=timeout,
    )
    assert settings.heartbeat_round_timeout == pytest.approx(expected)


def test_settings__a_round_timeout_leaving_no_renewal_is_refused():
    with pytest.raises(ValueError, match="HEARTBEAT_TIMEOUT"):
        Settings(database_url="x", lease_seconds=30, heartbeat_timeout_seconds=20)


@pytest.mark.parametrize(
    ("lease", "heartbeat", "timeout", "expected"),
    [(30, 10, None, 5.0), (3, 1, None, 0.5), (30, 3600, None, 0.1), (30, 10, 1.5, 1.5)],
)
def test_worker_config__heartbeat_timeout(lease, heartbeat, timeout, expected):
    config = WorkerConfig(
        worker_id="w",
        lease_seconds=lease,
        heartbeat_seconds=heartbeat,
        heartbeat_timeout_seconds=timeout,
    )
    assert config.heartbeat_timeout == pytest.approx(expected)
