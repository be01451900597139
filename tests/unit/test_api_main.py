"""``python -m api``: one process by default, uvicorn workers on request (queue mode only)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

import api.__main__ as api_main


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    monkeypatch.setenv("RUNYARD_DATABASE_URL", "postgresql://unused@127.0.0.1/unused")
    monkeypatch.delenv("RUNYARD_UI_SESSION_SECRET", raising=False)
    yield calls
    gc.unfreeze()  # the test process's objects go back to the collector


def test_main__workers_run_the_factory_and_share_one_session_secret(
    served: list[tuple[Any, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RUNYARD_API_WORKERS", "3")
    assert api_main.main(["--port", "8123"]) == 0
    [(app, options)] = served
    assert app == "api.__main__:app_from_env" and options["factory"] is True
    assert (options["workers"], options["port"]) == (3, 8123)
    assert len(os.environ["RUNYARD_UI_SESSION_SECRET"]) == 64


def test_main__one_process_by_default_with_what_startup_made_frozen(
    served: list[tuple[Any, dict[str, Any]]],
):
    gc.unfreeze()
    assert api_main.main(["--port", "8123"]) == 0
    [(app, options)] = served
    assert not isinstance(app, str) and "workers" not in options
    assert gc.get_freeze_count() > 0


def test_main__workers_are_refused_in_sync_mode(
    served: list[tuple[Any, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RUNYARD_QUEUE_ENABLED", "false")
    with pytest.raises(SystemExit) as refused:
        api_main.main(["--workers", "2"])
    assert refused.value.code == 2 and served == []
