"""Database timeouts: the libpq parameters every connection gets, and their settings."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from runyard.platform.db import DbTimeouts, libpq_params
from runyard.platform.settings import Settings

KEEPALIVES = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 25_000,
}


@pytest.mark.parametrize(
    ("timeouts", "url_options", "expected"),
    [
        (DbTimeouts(), None, KEEPALIVES),
        (
            DbTimeouts(statement_seconds=30, lock_seconds=5),
            None,
            {**KEEPALIVES, "options": "-c statement_timeout=30000 -c lock_timeout=5000"},
        ),
        (
            DbTimeouts(statement_seconds=0.25),
            "-c search_path=app",
            {**KEEPALIVES, "options": "-c search_path=app -c statement_timeout=250"},
        ),
        (DbTimeouts(), "-c search_path=app", {**KEEPALIVES, "options": "-c search_path=app"}),
        (
            DbTimeouts(connect_seconds=2, keepalives_idle_seconds=30, keepalives_count=6),
            None,
            {
                **KEEPALIVES,
                "connect_timeout": 2,
                "keepalives_idle": 30,
                "keepalives_count": 6,
                "tcp_user_timeout": 60_000,
            },
        ),
        (
            DbTimeouts(statement_seconds=0.0001, lock_seconds=0.0001),
            None,
            {**KEEPALIVES, "options": "-c statement_timeout=1 -c lock_timeout=1"},  # never 0
        ),
    ],
)
def test_libpq_params__carry_every_timeout(
    timeouts: DbTimeouts, url_options: str | None, expected: dict[str, Any]
):
    assert libpq_params(timeouts, url_options) == expected


def test_db_timeouts__from_settings_with_and_without_statement_timeouts():
    settings = Settings(
        database_url="x",
        db_connect_timeout_seconds=7,
        db_statement_timeout_seconds=12.5,
        db_lock_timeout_seconds=2,
        db_pool_timeout_seconds=3,
    )
    timeouts = DbTimeouts.from_settings(settings)
    assert timeouts.connect_seconds == 7 and timeouts.pool_seconds == 3
    assert timeouts.statement_seconds == 12.5 and timeouts.lock_seconds == 2
    bare = DbTimeouts.from_settings(settings, statements=False)
    assert bare.statement_seconds is None and bare.lock_seconds is None
    assert bare.connect_seconds == 7


def test_db_settings__defaults_never_wait_forever(monkeypatch: pytest.MonkeyPatch):
    for var in (
        "RUNYARD_DB_CONNECT_TIMEOUT_SECONDS",
        "RUNYARD_DB_STATEMENT_TIMEOUT_SECONDS",
        "RUNYARD_DB_LOCK_TIMEOUT_SECONDS",
        "RUNYARD_DB_POOL_TIMEOUT_SECONDS",
        "RUNYARD_DB_RETRY_AFTER_SECONDS",
    ):
        monkeypatch.delenv(var, raising=False)
    settings = Settings(database_url="x")
    assert settings.db_connect_timeout_seconds == 5
    assert settings.db_statement_timeout_seconds == 30
    assert settings.db_lock_timeout_seconds == 5
    assert settings.db_pool_timeout_seconds == 10
    assert settings.db_retry_after_seconds == 2
    assert settings.db_statement_timeout_seconds <= settings.lease_seconds


def test_db_settings__read_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNYARD_DB_STATEMENT_TIMEOUT_SECONDS", "8")
    monkeypatch.setenv("RUNYARD_DB_LOCK_TIMEOUT_SECONDS", "1.5")
    monkeypatch.setenv("RUNYARD_DB_KEEPALIVES_IDLE_SECONDS", "20")
    monkeypatch.setenv("RUNYARD_DB_RETRY_AFTER_SECONDS", "7")
    settings = Settings(database_url="x")
    assert settings.db_statement_timeout_seconds == 8
    assert settings.db_lock_timeout_seconds == 1.5
    assert settings.db_keepalives_idle_seconds == 20
    assert settings.db_retry_after_seconds == 7


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"db_connect_timeout_seconds": 0}, "db_connect_timeout_seconds"),
        ({"db_connect_timeout_seconds": 1}, "db_connect_timeout_seconds"),  # libpq: 2 at least
        ({"db_statement_timeout_seconds": 0}, "db_statement_timeout_seconds"),
        ({"db_lock_timeout_seconds": -1}, "db_lock_timeout_seconds"),
        ({"db_pool_timeout_seconds": 0}, "db_pool_timeout_seconds"),
        ({"db_keepalives_count": 0}, "db_keepalives_count"),
        ({"db_retry_after_seconds": 0}, "db_retry_after_seconds"),
        (
            {"db_statement_timeout_seconds": 3, "db_lock_timeout_seconds": 4},
            "LOCK_TIMEOUT_SECONDS must not exceed",
        ),
    ],
)
def test_db_settings__nonsense_is_rejected(values: dict[str, Any], message: str):
    with pytest.raises(ValidationError, match=message):
        Settings(database_url="x", **values)
