"""The heartbeat's bounds: the round timeout, its default, and the heartbeat pool's timeouts."""

from __future__ import annotations

import pytest

from runyard.platform.db import DbTimeouts
from runyard.platform.settings import Settings
from worker.__main__ import heartbeat_timeouts
from worker.service import WorkerConfig


def test_heartbeat_timeouts__bounded_by_one_round():
    base = DbTimeouts(connect_seconds=5, statement_seconds=30, lock_seconds=5)
    bounded = heartbeat_timeouts(base, 0.5)
    assert (bounded.statement_seconds, bounded.lock_seconds, bounded.connect_seconds) == (
        0.5,
        0.5,
        2,  # libpq's floor
    )
    assert bounded.keepalives_idle_seconds == base.keepalives_idle_seconds
    assert heartbeat_timeouts(base, 3.2).connect_seconds == 4
    assert heartbeat_timeouts(base, 10).connect_seconds == 5  # never longer than configured
    assert heartbeat_timeouts(DbTimeouts(), 2).lock_seconds == 2
    assert heartbeat_timeouts(base, None) is base


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
