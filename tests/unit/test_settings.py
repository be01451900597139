"""Settings: env prefix, defaults, validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runyard.platform.settings import Settings, normalize_database_url


def test_defaults__follow_design(monkeypatch: pytest.MonkeyPatch):
    for var in ("RUNYARD_LEASE_SECONDS", "RUNYARD_HEARTBEAT_SECONDS", "RUNYARD_API_PORT"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings(database_url="x")
    assert settings.lease_seconds == 30 and settings.heartbeat_interval == 10
    assert settings.api_port == 8000 and settings.reaper_interval_seconds == 5
    assert settings.queue_enabled and not settings.auth_disabled


def test_env_prefix__is_read(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNYARD_LEASE_SECONDS", "9")
    monkeypatch.setenv("RUNYARD_AUTH_DISABLED", "true")
    settings = Settings(database_url="x")
    assert settings.lease_seconds == 9 and settings.heartbeat_interval == 3
    assert settings.auth_disabled


def test_heartbeat_not_shorter_than_lease__is_rejected():
    with pytest.raises(ValidationError, match="HEARTBEAT"):
        Settings(database_url="x", lease_seconds=10, heartbeat_seconds=10)


@pytest.mark.parametrize(
    "url",
    ["postgres://u:p@h/db", "postgresql://u:p@h/db", "postgresql+psycopg://u:p@h/db"],
)
def test_database_url__normalized_to_psycopg3(url: str):
    assert normalize_database_url(url) == "postgresql+psycopg://u:p@h/db"


def test_missing_database_url__is_a_clear_error():
    with pytest.raises(ValueError, match="RUNYARD_DATABASE_URL"):
        normalize_database_url("")


def test_abuse_caps__default_on_and_generous_and_0_turns_them_off():
    settings = Settings(database_url="x")
    assert settings.tenant_max_created_per_window == 100_000
    assert settings.tenant_created_window_seconds == 3600
    assert settings.tenant_max_stored_runs == 1_000_000
    assert settings.batch_max_dependencies == 10_000
    off = Settings(
        database_url="x",
        tenant_max_created_per_window=0,
        tenant_max_stored_runs=0,
        batch_max_dependencies=0,
    )
    assert (off.tenant_max_created_per_window, off.tenant_max_stored_runs) == (0, 0)
    with pytest.raises(ValidationError):
        Settings(database_url="x", tenant_created_window_seconds=0)
