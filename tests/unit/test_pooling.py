"""Which connection does what, directly on Postgres or behind a transaction pooler."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import ValidationError
from sqlalchemy import event

from runyard.platform.db import DbTimeouts, libpq_params, make_engine
from runyard.platform.pooling import ConnectionPlan, Pooler, connection_plan, log_plan
from runyard.platform.settings import Settings
from runyard.reads.notify import RunNotifier
from worker.wakeup import Wakeups

POOLED = "postgresql://u@127.0.0.1:6432/db"
DIRECT = "postgresql://u@127.0.0.1:5432/db"


@pytest.mark.parametrize(
    ("pooler", "listen_url", "expected"),
    [
        ("none", "", ConnectionPlan(5, True, POOLED)),
        ("none", DIRECT, ConnectionPlan(5, True, DIRECT)),
        ("transaction", "", ConnectionPlan(None, False, None)),
        ("transaction", DIRECT, ConnectionPlan(None, False, DIRECT)),
    ],
)
def test_connection_plan__per_pooler_and_listen_url(
    pooler: Pooler, listen_url: str, expected: ConnectionPlan
):
    assert connection_plan(pooler, POOLED, listen_url) == expected


@pytest.mark.parametrize(
    ("pooler", "expected"),
    [
        ("none", ConnectionPlan(5, True, POOLED)),
        ("transaction", ConnectionPlan(5, False, None)),
    ],
)
def test_connection_plan__a_pooler_that_carries_prepared_statements_keeps_them(
    pooler: Pooler, expected: ConnectionPlan
):
    assert connection_plan(pooler, POOLED, "", pooler_prepares=True) == expected


def test_settings__read_whether_the_pooler_prepares(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNYARD_DATABASE_POOLER", "transaction")
    monkeypatch.setenv("RUNYARD_DATABASE_POOLER_PREPARES", "true")
    monkeypatch.delenv("RUNYARD_LISTEN_DATABASE_URL", raising=False)
    assert Settings(database_url=POOLED).connection_plan() == ConnectionPlan(5, False, None)


def test_settings__read_the_pooler_and_the_listen_url(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNYARD_DATABASE_POOLER", "transaction")
    monkeypatch.setenv("RUNYARD_LISTEN_DATABASE_URL", DIRECT)
    settings = Settings(database_url=POOLED)
    assert settings.connection_plan() == ConnectionPlan(None, False, DIRECT)


def test_settings__default_to_a_direct_database(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RUNYARD_DATABASE_POOLER", raising=False)
    monkeypatch.delenv("RUNYARD_LISTEN_DATABASE_URL", raising=False)
    assert Settings(database_url=POOLED).connection_plan() == ConnectionPlan(5, True, POOLED)


def test_settings__refuse_an_unknown_pooler():
    with pytest.raises(ValidationError):
        Settings(database_url=POOLED, database_pooler="session")


def test_libpq_params__without_session_timeouts_keep_the_url_options():
    timeouts = DbTimeouts(statement_seconds=30, lock_seconds=5)
    params = libpq_params(timeouts, "-c search_path=app", session_timeouts=False)
    assert params["options"] == "-c search_path=app"
    assert "options" not in libpq_params(timeouts, session_timeouts=False)


def test_libpq_params__generic_plans_only_where_session_settings_go_and_the_url_chose_none():
    timeouts = DbTimeouts()
    generic = "-c plan_cache_mode=force_generic_plan"
    assert libpq_params(timeouts, generic_plans=True)["options"] == generic
    assert "options" not in libpq_params(timeouts)
    assert "options" not in libpq_params(timeouts, session_timeouts=False, generic_plans=True)
    for chosen in ("-c plan_cache_mode=force_custom_plan", "--plan-cache-mode=auto"):
        assert libpq_params(timeouts, chosen, generic_plans=True)["options"] == chosen


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("pooler", "prepare_threshold", "options"),
    [
        ("none", 5, "-c statement_timeout=30000"),
        ("transaction", None, None),
    ],
)
def test_make_engine__connects_as_the_plan_says(
    pooler: Pooler, prepare_threshold: int | None, options: str | None
):
    engine = make_engine(
        POOLED,
        timeouts=DbTimeouts(statement_seconds=30),
        plan=connection_plan(pooler, POOLED, ""),
    )
    seen: dict[str, object] = {}

    def capture(dialect: object, record: object, cargs: object, cparams: dict[str, object]):
        seen.update(cparams)
        raise _Stop  # never connect

    event.listen(engine, "do_connect", capture)
    try:
        with pytest.raises(_Stop):
            engine.connect()
    finally:
        engine.dispose()
    assert seen["prepare_threshold"] == prepare_threshold
    assert seen.get("options") == options


@pytest.mark.parametrize(
    ("plan", "poll_seconds", "logged"),
    [
        (ConnectionPlan(5, True, POOLED), 1.5, None),
        (ConnectionPlan(None, False, DIRECT), 1.5, "LISTEN on the direct URL"),
        (ConnectionPlan(None, False, None), 1.5, "no LISTEN (no RUNYARD_LISTEN_DATABASE_URL)"),
        (ConnectionPlan(None, False, None), None, "timeouts from the database role"),
        (ConnectionPlan(None, False, None), None, "no prepared statements"),
        (ConnectionPlan(5, False, None), None, "prepared statements through the pooler"),
    ],
)
def test_log_plan__says_what_is_unusual(
    plan: ConnectionPlan,
    poll_seconds: float | None,
    logged: str | None,
    caplog: pytest.LogCaptureFixture,
):
    with caplog.at_level(logging.INFO):
        log_plan(logging.getLogger("test"), plan, poll_seconds)
    if logged is None:
        assert caplog.records == []
    else:
        [record] = caplog.records
        assert logged in record.getMessage()
        assert ("LISTEN" in record.getMessage()) == (poll_seconds is not None)


def test_run_notifier__without_a_url_never_listens():
    notifier = RunNotifier(None)
    asyncio.run(asyncio.wait_for(notifier.run(), timeout=5))
    assert not notifier.connected.is_set()


def test_wakeups__without_a_url_never_listen():
    wakeups = Wakeups(None, lambda: None, lambda job_id: None)
    wakeups.start()
    wakeups.stop()
    assert not wakeups.connected.is_set()
